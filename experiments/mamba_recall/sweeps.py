"""The Mamba recall study's runs (experiments/mamba_recall/README.md), as
Python files for `python -m lra.sweep --sweep
experiments/mamba_recall/sweeps.py:FN --out runs/mamba_recall`.

`mamba` at width 128 on MQAR `small` (length 64): the settings that stay
on the 1 / pairs plateau within 2,000-4,000 steps (plateau), and the long
schedule that leaves it (long).
"""

# Zoology's block: norm, mixer, residual; no feed-forward, no short_conv,
# weight decay 0.1, no warm-up.
ZOOLOGY_BLOCK = {
  'model.block': 'ssm',
  'model.short_conv': 0,
  'weight_decay': 0.1,
  'warmup_steps': 0,
}


def _mamba(out, config, grid=None):
  return {
    'tasks': 'mqar',
    'models': 'mamba',
    'preset': 'small',
    'grid': grid or {},
    'config': {
      'model.emb_dim': 128,
      'data.test_splits': '64:4,64:16',
      **config,
    },
    'out': out,
  }


def plateau():
  """The table's short runs: the `small` preset at 2,000 steps, Zoology's
  block at 4,000 (the run `experiments.mamba_recall.gradients` reads), with
  Zoology's embedding scale, and on 4 pairs at two rates."""
  return [
    _mamba('small_2k', {'learning_rate': '1e-3', 'num_train_steps': 2000}),
    _mamba(
      'zoo_4k',
      {**ZOOLOGY_BLOCK, 'learning_rate': '1e-3', 'num_train_steps': 4000},
    ),
    _mamba(
      'zoo_embed',
      {
        **ZOOLOGY_BLOCK,
        'learning_rate': '1e-3',
        'num_train_steps': 2000,
        'model.embed_std': 0.02,
      },
    ),
    _mamba(
      'zoo_4pairs',
      {
        **ZOOLOGY_BLOCK,
        'data.num_kv_pairs': 4,
        'data.test_splits': '64:8,64:16',
        'num_train_steps': 2000,
      },
      grid={'learning_rate': ['1e-3', '3.2e-3']},
    ),
  ]


def long():
  """Zoology's block on 4 pairs with a 20,000-step cosine: it leaves the
  plateau at step 2,000-2,500 (stopped at 3,851 on the CPU)."""
  return _mamba(
    'mamba_long',
    {
      **ZOOLOGY_BLOCK,
      'data.num_kv_pairs': 4,
      'num_train_steps': 20000,
      'eval_every_steps': 500,
      'data.test_splits': '64:8,64:16',
    },
    grid={'learning_rate': ['1e-3']},
  )
