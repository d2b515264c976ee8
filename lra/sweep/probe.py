"""A sweep's --dry_run probe (lra/sweep/estimate.py): for a run with no
measured rate, build its config's state, compile its training step (the
step train.py's loop runs: lra.train.build.create_state,
lra.train.steps.make_train_step) on a random batch of the task's shapes
(lra.train.batching.random_batch: training_batch on random data), time a
few steps, then compile and time its evaluation step the same way.

The estimate of a run of S steps left:
  S x step time (median; the range from the fastest and slowest probed
  step) + compiling both steps (as measured) + its evaluations (the
  validation split every eval_every_steps and at the end, the test split
  twice: best and last checkpoints) x eval step time, when the split sizes
  are known (the task's prepared cache, else data.num_val / data.num_test
  of the config); data loading or generation and checkpoint writes are not
  counted. The probe takes the compile time plus about `seconds` of steps.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import statistics
import time

from lra import data as tasks
from lra.train import rundir
from lra.train.metrics import flatten

# Fields that change neither the step's shapes nor its cost: runs that
# differ in them only share one probe.
NOT_SHAPES = (
  *(k for k in rundir.RESUMABLE_CHANGES if k != 'eval_batch_size'),
  *rundir.OPTIMISER_CHANGES,
  'seed',
  'preset',
  'model_name',
  'init_from',
  'init_from_checkpoint',
)


@dataclasses.dataclass
class Probe:
  """What one probe measured (seconds)."""

  steps: list  # each timed training step
  compile_seconds: float  # state built, train and eval steps compiled
  eval_steps: list  # each timed evaluation step
  eval_batches: dict  # split -> batches per evaluation (known splits only)

  @property
  def rate(self) -> float:
    return 1.0 / statistics.median(self.steps)


def shape_key(config) -> str:
  """The config without the fields that leave the step unchanged (NOT_SHAPES),
  as JSON: one probe per distinct key."""
  flat = flatten(json.loads(config.to_json()))
  return json.dumps(
    {k: v for k, v in flat.items() if k not in NOT_SHAPES}, sort_keys=True
  )


def split_sizes(config, task) -> dict:
  """{split: examples} of val and test: from the task's prepared cache,
  else the config's data.num_val / data.num_test; {} when neither."""
  import numpy as np  # pylint: disable=g-import-not-at-top

  options = config.data.to_dict()
  data_dir = config.data_dir or tasks.default_data_dir()
  try:
    path = task.cache_dir(data_dir, options)
    sizes = {
      split: int(
        np.load(os.path.join(path, f'{split}_labels.npy'), mmap_mode='r').shape[
          0
        ]
      )
      for split in ('val', 'test')
    }
    return sizes
  except Exception:  # pylint: disable=broad-except
    pass  # not prepared (or not readable): the config may say
  sizes = {s: options.get(f'num_{s}') for s in ('val', 'test')}
  return {s: int(n) for s, n in sizes.items() if isinstance(n, int)}


_MESH = []


def probe(config, seconds: float = 2.0, min_steps: int = 3) -> Probe:
  """Compiles and times `config`'s training and evaluation steps (module
  docstring): at least min_steps timed training steps and as many more as
  fit in `seconds`, after one untimed first call."""
  # pylint: disable=g-import-not-at-top
  import jax

  from lra.train import batching, build, objectives, runtime, steps
  # pylint: enable=g-import-not-at-top

  if not _MESH:
    _MESH.append(runtime.make_mesh())
  replicated, batch_sharding = _MESH[0]
  task = tasks.get_task(config.task)
  runtime.check_batch(config.batch_size)
  start = time.perf_counter()
  graphdef, state = build.create_state(config, task, replicated)
  batch = runtime.to_device(batching.random_batch(config, task), batch_sharding)
  prepare = objectives.in_step(config, task)
  train_step = steps.make_train_step(
    graphdef,
    prepare,
    config.seed,
    packed_lr=(steps.learning_rate_schedule(config), config.grad_accum_steps),
  )
  compiled = train_step.lower(state, batch).compile()
  compile_seconds = time.perf_counter() - start
  state, metrics = compiled(state, batch)  # the first call: not timed
  jax.block_until_ready((state, metrics))
  timed = []
  while len(timed) < min_steps or sum(timed) < seconds:
    start = time.perf_counter()
    state, metrics = compiled(state, batch)
    jax.block_until_ready((state, metrics))
    timed.append(time.perf_counter() - start)
    if len(timed) >= 200:
      break

  eval_config = config.copy_and_resolve_references()
  with eval_config.unlocked():
    eval_config.batch_size = config.eval_batch_size or config.batch_size
  eval_batch = runtime.to_device(
    batching.random_batch(eval_config, task), batch_sharding
  )
  key = objectives.eval_key(config, 0)
  eval_step = steps.make_eval_step(graphdef, prepare)
  start = time.perf_counter()
  jax.block_until_ready(eval_step(state, eval_batch, key))  # compiles
  compile_seconds += time.perf_counter() - start
  eval_timed = []
  for _ in range(max(2, min_steps)):
    start = time.perf_counter()
    jax.block_until_ready(eval_step(state, eval_batch, key))
    eval_timed.append(time.perf_counter() - start)
  size = eval_config.batch_size
  batches = {
    split: -(-n // size) for split, n in split_sizes(config, task).items()
  }
  del state, batch, eval_batch, compiled
  return Probe(timed, compile_seconds, eval_timed, batches)


def evaluations(config, start_step: int) -> dict:
  """{split: passes} a run makes from start_step to its end: validation
  every eval_every_steps and at the last step, the test split on the best
  and the last checkpoints."""
  total, every = config.num_train_steps, max(config.eval_every_steps, 1)
  val = total // every - start_step // every
  if total % every:
    val += 1
  return {'val': max(val, 0), 'test': 2}


def estimate(found: Probe, config, start_step: int) -> dict:
  """{'seconds', 'low', 'high'} (the estimate and its range from the
  fastest and slowest probed steps), 'rate' (steps/s), 'overhead'
  (compilation and evaluation, seconds) and 'evaluated' (whether the
  evaluations are counted: their split sizes known) of the run's
  remaining time."""
  left = max(config.num_train_steps - start_step, 0)
  passes = evaluations(config, start_step)
  counted = set(passes) <= set(found.eval_batches)
  eval_batches = (
    sum(n * found.eval_batches[s] for s, n in passes.items()) if counted else 0
  )

  def total(step, eval_step):
    return left * step + found.compile_seconds + eval_batches * eval_step

  mid = total(
    statistics.median(found.steps), statistics.median(found.eval_steps)
  )
  low = total(min(found.steps), min(found.eval_steps))
  high = total(max(found.steps), max(found.eval_steps))
  return {
    'seconds': mid,
    'low': low,
    'high': high,
    'rate': found.rate,
    'overhead': mid - left * statistics.median(found.steps),
    'evaluated': counted,
    'steps': left,
  }


def minutes(seconds: float) -> str:
  """'0.4', '12', '1.5' (minutes, two significant digits)."""
  m = seconds / 60
  if m == 0:
    return '0'
  digits = max(0, 1 - int(math.floor(math.log10(m))))
  return f'{m:.{digits}f}'
