"""Runtime pieces shared by train.py, eval.py and benchmark.py: the device
mesh, batch placement, data loading and exact evaluation."""

import json
import os

import jax
import numpy as np
from tqdm import tqdm

from lra import batching, cache, steps, tasks
from lra.errors import UserError
from lra.metrics import write_json

# Config keys that may change between a run and its resumption.
RESUMABLE_CHANGES = (
  'num_train_steps',
  'eval_every_steps',
  'log_every_steps',
  'checkpoint_every_steps',
  'keep_checkpoints',
  'data_dir',
  'eval_batch_size',
)


def make_mesh(devices=None):
  """A 1-D ('data',) mesh over `devices` (default: all), set as the global
  mesh; returns (replicated, batch) shardings."""
  devices = jax.devices() if devices is None else devices
  mesh = jax.make_mesh(
    (len(devices),),
    ('data',),
    axis_types=(jax.sharding.AxisType.Auto,),
    devices=devices,
  )
  jax.set_mesh(mesh)
  replicated = jax.NamedSharding(mesh, jax.P())
  batch_sharding = jax.NamedSharding(mesh, jax.P('data'))
  return replicated, batch_sharding


def check_batch(batch_size, what='batch_size'):
  n = jax.device_count()
  if batch_size % n:
    raise UserError(
      f'{what} {batch_size} is not divisible by the {n} devices; use a '
      f'multiple of {n}, e.g. --config.{what}={max(n, batch_size // n * n)}.'
    )


def to_device(batch, sharding):
  return {
    k: jax.make_array_from_process_local_data(sharding, v)
    for k, v in batch.items()
  }


def load_data(config, task, progress=True):
  data_dir = config.data_dir or tasks.default_data_dir()
  path = task.ensure_prepared(data_dir, config.data.to_dict(), progress)
  return {s: cache.load_split(path, s) for s in cache.SPLITS}


def evaluate(eval_step, state, split_data, config, batch_sharding, desc=''):
  inputs, labels = split_data
  size = config.eval_batch_size or config.batch_size
  check_batch(
    size, 'eval_batch_size' if config.eval_batch_size else 'batch_size'
  )
  total = None
  batches = batching.eval_batches(
    inputs,
    labels,
    global_batch=size,
    length=config.max_length,
    process_index=jax.process_index(),
    process_count=jax.process_count(),
  )
  for batch in tqdm(
    batches,
    desc=desc,
    leave=False,
    disable=not desc,
    total=batching.num_eval_batches(len(labels), size),
  ):
    sums = eval_step(state, to_device(batch, batch_sharding))
    total = sums if total is None else jax.tree.map(np.add, total, sums)
  return steps.finish(jax.device_get(total))


def check_config(config, workdir, resuming):
  """Writes config.json; a resumed run must keep the saved config."""
  path = os.path.join(workdir, 'config.json')
  new = json.loads(config.to_json())
  if resuming and os.path.exists(path):
    with open(path) as f:
      old = json.load(f)
    diff = sorted(
      k
      for k in set(old) | set(new)
      if k not in RESUMABLE_CHANGES and old.get(k) != new.get(k)
    )
    if diff:
      raise UserError(
        f'{workdir} holds a run with a different config ({", ".join(diff)} '
        'differ); use a new --workdir to start another run.'
      )
  os.makedirs(workdir, exist_ok=True)
  write_json(path, new)
