"""The reference queue's jobs, in the order issue 48 asks for them.

1. speed/<L>: LRA Table 2 on the accelerator, one job per length (1K-4K):
   every model at the Text paper model, batch 32, bfloat16 (benchmark.py
   --preset paper; transformer_fused runs cuDNN flash attention there),
   steps/s and peak memory against the transformer measured in the same
   job. A job has the GPU to itself; a stopped one is measured again whole,
   so its ratios stay those of one call.
2. listops/<model>: ListOps at the reference configuration (5,000 steps,
   4 layers of 512, 2,000 tokens, batch 32) in bfloat16, the transformer
   row first (transformer_fused: cuDNN), then the paper's other rows, then
   the state-space and recall-era mixers (s5 with its paper's recipe,
   configs/s5_reference.py, which the config applies by name, in float32).
   The GPU to itself; its checkpoint (about 200 MB with Adam's moments) is
   too big to carry, so a stopped run resumes only on the same machine
   (the second call of a lease), else it starts again.
3. pathfinder/<model>: Pathfinder-32 at the reference configuration (62,400
   steps of batch 512), the transformer row first. The rows with under
   about 150k parameters (PATHFINDER_CARRIED) carry their checkpoint in
   the archive and continue lease after lease, one per task at a time,
   beside the other sharing jobs; the others wait for a lease long enough.
4. mqar/w<width>_lr<rate>/<model>: MQAR at Zoology's protocol
   (configs/mqar.py `zoology` preset: the mixer alone in each block, no
   shared short_conv for mixers, 4 pairs at length 64) with a 20,000-step
   cosine (Zoology's schedule length, long enough for Mamba to leave the
   1 / pairs plateau: experiments/mqar/README.md), float32 at 'highest'
   matmul precision, tuned over two widths and three rates: one pass of
   every model per (width, rate), so each pass completes a table.

Expected seconds are for one H100/H200 (the queue measures the real ones
and uses them once a job has run; experiments/reference/README.md lists
both). --tiny gives a few of each at smoke scale, for a CPU (tests).
"""

from __future__ import annotations

import dataclasses
import sys

# How a stopped job goes on: CARRY its checkpoint travels in the archive
# (small), MACHINE it stays in the work folder of the machine it ran on (a
# later call on that machine resumes; a fresh machine starts again), RERUN
# the job is run again whole.
CARRY, MACHINE, RERUN = 'carry', 'machine', 'rerun'

LENGTHS = (1024, 2048, 3072, 4096)
# Every model of the speed table, in its row order: the exact baselines,
# the paper's Table 2 rows, the rest of the registry.
SPEED_MODELS = (
  'transformer',
  'transformer_fused',
  'local',
  'linformer',
  'reformer',
  'sinkhorn',
  'synthesizer',
  'bigbird',
  'linear_transformer',
  'performer',
  'longformer',
  'sparse_transformer',
  'transformer_xl',
  'compressive_transformer',
  's4d',
  's5',
  'retnet',
  'mamba',
  'mamba2',
  'h3',
  'hyena',
  'gla',
  'deltanet',
  'based',
)
# The paper's Table 1 rows after the transformer, in its order.
PAPER_ROWS = (
  'local',
  'sparse_transformer',
  'longformer',
  'linformer',
  'reformer',
  'sinkhorn',
  'synthesizer',
  'bigbird',
  'linear_transformer',
  'performer',
)
# State-space and recall-era mixers (s5 last: its recipe is the longest).
MIXER_ROWS = (
  's4d',
  'retnet',
  'mamba',
  'mamba2',
  'h3',
  'hyena',
  'gla',
  'deltanet',
  'based',
  's5',
)
# Rows whose config applies an author's recipe (configs/models.py
# PAPER_RECIPES): run as the recipe says (float32).
RECIPES = ('s5',)
# Pathfinder rows whose checkpoint (latest and best, with Adam's moments:
# about 24 bytes per parameter) is small enough to carry, under 4 MiB:
# 46k-150k parameters; linformer (570k), performer and linear_transformer
# (247k), synthesizer (8.5M) and s5's recipe (1.4M) are not.
PATHFINDER_CARRIED = (
  'transformer',
  'local',
  'sparse_transformer',
  'longformer',
  'reformer',
  'sinkhorn',
  'bigbird',
)
MQAR_MODELS = (
  'transformer',
  'linear_transformer',
  'based',
  'gla',
  'deltanet',
  'retnet',
  's4d',
  's5',
  'h3',
  'hyena',
  'mamba',
  'mamba2',
)
MQAR_WIDTHS = (64, 128)
MQAR_RATES = ('1e-3', '3.2e-3', '1e-2')
MQAR_STEPS = 20_000

# Expected device seconds (one H100/H200), from the rates measured in
# earlier leases (docs/benchmark.md, docs/results.md, experiments/mqar/):
# a speed cell is a process (start-up, compilation, 23 steps), about 10 s,
# 24 of them per length; ListOps reference ran 4.0 steps/s (XLA bf16,
# shared) and cuDNN is 2-2.9x the einsum at 1-2K, so about 10 steps/s
# alone, 5,000 steps with evaluations; Pathfinder's 1-layer transformer
# ran 175 steps/s of batch 32 at 1,024 tokens, so 62,400 steps of batch
# 512 are about 1.6 hours; MQAR ran 70-130 steps/s per training with ten
# sharing the GPU.
SPEED_SECONDS = {1024: 220, 2048: 250, 3072: 290, 4096: 330}
LISTOPS_SECONDS = 600
LISTOPS_SLOW = {'mamba': 1200, 'h3': 900, 'hyena': 900, 's5': 4800}
PATHFINDER_SECONDS = 5700
PATHFINDER_SLOW = {'s5': 25_000}
MQAR_SECONDS = 300


@dataclasses.dataclass(frozen=True)
class Job:
  """One command of the queue.

  name: its folder in the archive and the work folder ('listops/local').
  kind: 'train' (train.py) or 'speed' (benchmark.py).
  args: the command after the interpreter; the queue appends --workdir /
    --out.
  seconds: expected device seconds when it runs from the start.
  shares: whether it may run beside other sharing jobs on the GPU.
  resume: CARRY, MACHINE or RERUN (above).
  spans: whether it may start though it cannot finish in this lease
    (CARRY only; one such job per task at a time).
  task, row: the table cell it fills (row: the paper's model name).
  model: the model it runs (transformer_fused for the transformer row).
  prepare: the data command it waits for (run once per call, on the
    CPU, timed), or ().
  env: environment variables of its process.
  cells: a speed job's models (its cells).
  """

  name: str
  kind: str
  args: tuple[str, ...]
  seconds: float
  shares: bool
  resume: str
  task: str
  row: str
  model: str
  spans: bool = False
  prepare: tuple[str, ...] = ()
  env: tuple[tuple[str, str], ...] = ()
  cells: tuple[str, ...] = ()
  length: int | None = None

  def command(self, workdir: str) -> list[str]:
    """The job's command line, writing into `workdir`."""
    flag = '--out' if self.kind == 'speed' else '--workdir'
    return [sys.executable, *self.args, f'{flag}={workdir}']

  def meta(self) -> dict:
    """What the archive records of the job (the report reads it)."""
    return {
      'kind': self.kind,
      'task': self.task,
      'row': self.row,
      'model': self.model,
      'length': self.length,
      'seconds_expected': self.seconds,
      'shares': self.shares,
      'resume': self.resume,
      'spans': self.spans,
      'command': ' '.join(['python', *self.args]),
    }


def _prepare(task: str, *options: str) -> tuple[str, ...]:
  return ('-m', 'lra.data.prepare', task, *options)


def speed_jobs(tiny: bool) -> list[Job]:
  lengths = (64, 128) if tiny else LENGTHS
  models = ('transformer', 'local') if tiny else SPEED_MODELS
  jobs = []
  for length in lengths:
    args = ['benchmark.py', f'--models={",".join(models)}']
    args += [f'--lengths={length}']
    if tiny:  # one process, no deadline per cell: seconds on a CPU
      args += ['--preset=tiny', '--batch_size=4', '--cell_timeout_s=0']
    else:
      args += ['--preset=paper', '--dtype=bfloat16', '--cell_timeout_s=240']
    jobs.append(
      Job(
        name=f'speed/{length}',
        kind='speed',
        args=tuple(args),
        seconds=30 if tiny else SPEED_SECONDS[length],
        shares=False,
        resume=RERUN,
        task='speed',
        row='all',
        model='all',
        cells=models,
        length=length,
      )
    )
  return jobs


def _train(
  name, task, model, row, preset, overrides, seconds, *, tiny, **kwargs
) -> Job:
  spec = f'configs/{task}.py:{model}' + (f',{preset}' if preset else '')
  args = ('train.py', f'--config={spec}', *overrides)
  return Job(
    name=name,
    kind='train',
    args=args,
    seconds=seconds,
    task=task,
    row=row,
    model=model,
    **kwargs,
  )


def listops_jobs(tiny: bool) -> list[Job]:
  """ListOps at the reference configuration, one job per row. The GPU to
  itself; resumed on the same machine only (MACHINE: 4 layers of 512 keep
  about 200 MB of checkpoints with Adam's moments, s5's recipe about 8)."""
  rows = ('transformer', 'local') if tiny else ('transformer', *PAPER_ROWS)
  rows += () if tiny else MIXER_ROWS
  jobs = []
  for row in rows:
    model = 'transformer_fused' if row == 'transformer' else row
    # bfloat16 on the accelerator, except where an author's recipe
    # (configs/s5_reference.py, float32) is applied.
    bf16 = not tiny and row not in RECIPES
    jobs.append(
      _train(
        f'listops/{row}',
        'listops',
        model,
        row,
        'smoke' if tiny else '',
        ('--config.dtype=bfloat16',) if bf16 else (),
        20 if tiny else LISTOPS_SLOW.get(row, LISTOPS_SECONDS),
        tiny=tiny,
        shares=False,
        resume=MACHINE,
        prepare=_prepare('listops', '--variant=smoke')
        if tiny
        else _prepare('listops'),
      )
    )
  return jobs


def pathfinder_jobs(tiny: bool) -> list[Job]:
  """Pathfinder-32 at the reference configuration, one job per row: those
  whose checkpoint travels (PATHFINDER_CARRIED) span leases, one at a
  time; the others (MACHINE) wait for a lease long enough."""
  rows = ('transformer', 'local') if tiny else ('transformer', *PAPER_ROWS)
  rows += () if tiny else ('s5',)
  jobs = []
  for row in rows:
    model = 'transformer_fused' if row == 'transformer' else row
    carried = tiny or row in PATHFINDER_CARRIED
    if tiny:
      overrides = (
        '--config.num_train_steps=40',
        '--config.checkpoint_every_steps=10',
      )
    else:
      # A save every 2 evaluations, so a lease loses little if killed.
      overrides = ('--config.checkpoint_every_steps=624',)
      if row not in RECIPES:
        overrides = ('--config.dtype=bfloat16', *overrides)
    jobs.append(
      _train(
        f'pathfinder/{row}',
        'pathfinder',
        model,
        row,
        'smoke' if tiny else '',
        overrides,
        20 if tiny else PATHFINDER_SLOW.get(row, PATHFINDER_SECONDS),
        tiny=tiny,
        shares=True,
        resume=CARRY if carried else MACHINE,
        spans=carried,
        prepare=() if tiny else _prepare('pathfinder'),
      )
    )
  return jobs


def mqar_jobs(tiny: bool) -> list[Job]:
  jobs = []
  widths = (16,) if tiny else MQAR_WIDTHS
  rates = ('1e-3',) if tiny else MQAR_RATES
  models = ('transformer', 'mamba') if tiny else MQAR_MODELS
  for width in widths:
    for rate in rates:
      for model in models:
        overrides = [
          f'--config.model.emb_dim={width}',
          f'--config.learning_rate={rate}',
        ]
        if not tiny:
          overrides += [
            f'--config.num_train_steps={MQAR_STEPS}',
            '--config.eval_every_steps=1000',
            '--config.checkpoint_every_steps=1000',
          ]
        jobs.append(
          _train(
            f'mqar/w{width}_lr{rate}/{model}',
            'mqar',
            model,
            model,
            'zoology,smoke' if tiny else 'zoology',
            tuple(overrides),
            20 if tiny else MQAR_SECONDS,
            tiny=tiny,
            shares=True,
            resume=CARRY,
            env=(('JAX_DEFAULT_MATMUL_PRECISION', 'highest'),),
          )
        )
  return jobs


def queue_jobs(tiny: bool = False) -> list[Job]:
  """Every job of the queue, in its order (`tiny`: the smoke-scale
  versions for a CPU)."""
  return [
    *speed_jobs(tiny),
    *listops_jobs(tiny),
    *pathfinder_jobs(tiny),
    *mqar_jobs(tiny),
  ]
