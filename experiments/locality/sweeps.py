"""The locality probe's sweeps (experiments/locality/README.md), as Python
files for `python -m lra.sweep --sweep experiments/locality/sweeps.py:FN
--out runs/locality`.

Each returns the runs `python -m experiments.locality.locality` plans for
the same task, preset, blocks and overrides (tests/test_experiments.py
checks that they are the same): `local` once per block size (a grid of
model.attention.block_size), then the full `transformer`, into one folder,
so `python -m experiments.locality.locality --task TASK --preset small
--out runs/locality --plot_only` draws them.
"""

KEY = 'model.attention.block_size'


def _probe(task, blocks, config=None):
  config = config or {}
  return [
    {
      'tasks': task,
      'models': 'local',
      'preset': 'small',
      'grid': {KEY: [str(b) for b in blocks]},
      'config': config,
    },
    {
      'tasks': task,
      'models': 'transformer',
      'preset': 'small',
      'config': config,
    },
  ]


def mqar():
  """MQAR `small`: blocks 2 .. 32 and 64, the whole length (one block)."""
  return _probe('mqar', [2, 4, 8, 16, 32, 64])


def listops():
  """ListOps `small` at 300 steps (the preset's 1,000 did not fit the
  sessions' CPU time): blocks 2 .. 128 and 201 (max_length 200 + the CLS
  token: one block)."""
  return _probe(
    'listops',
    [2, 4, 8, 16, 32, 64, 128, 201],
    {'num_train_steps': 300, 'eval_every_steps': 100},
  )
