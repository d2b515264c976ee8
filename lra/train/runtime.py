"""Runtime pieces shared by train.py, eval.py and benchmark.py: the device
mesh, batch placement, data loading and exact evaluation. (Multi-process
start-up is lra/train/processes.py.)"""

import json
import os
import shutil
import sys

import jax
import jax.numpy as jnp
import numpy as np
from tqdm import tqdm

from lra import data as tasks
from lra.data import cache
from lra.errors import UserError
from lra.train import batching, objectives, processes


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
  """The host's rows of a batch as global arrays sharded over the batch
  axis: one device_put of the whole dict in a single process (a batched
  transfer), the process-local assembly with several."""
  if jax.process_count() == 1:
    return jax.device_put(batch, sharding)
  return {
    k: jax.make_array_from_process_local_data(sharding, v)
    for k, v in batch.items()
  }


def load_data(config, task, progress=True):
  """The three splits; a damaged cache of a generated task is rebuilt (with
  a warning), one of a converted task is an error naming the command that
  rebuilds it."""
  from lra.data import prepare  # pylint: disable=g-import-not-at-top

  data_dir = config.data_dir or tasks.default_data_dir()
  options = config.data.to_dict()
  flag = '--config.data_dir' if config.data_dir else 'LRA_DATA_DIR'
  for attempt in range(2):
    try:
      path = task.ensure_prepared(data_dir, options, progress)
      splits = {s: cache.load_split(path, s) for s in cache.SPLITS}
      check_ranges(
        task,
        options,
        splits,
        path,
        prepare.command(task.name, data_dir, options),
      )
      return task.transform(splits, options)
    except cache.CacheError as e:
      if not task.generated or attempt:
        raise UserError(
          f'{e}; rebuild the cache with '
          f'`{prepare.command(task.name, data_dir, options)}`.'
        ) from None
      print(f'warning: {e}; regenerating the cache.', file=sys.stderr)
      shutil.rmtree(task.cache_dir(data_dir, options))
    except OSError as e:
      raise UserError(
        f'Cannot prepare the {task.name} cache under {data_dir} '
        f'({e.strerror}: {e.filename}); set {flag} to a directory you can '
        'write to.'
      ) from None


def check_ranges(task, options, splits, path, rebuild):
  """UserError naming the file and the first bad record when a cached
  split holds a token id outside the vocabulary or a label outside the
  classes (a cache written by other code, or damaged in a way its checksum
  does not see): such data would otherwise show up as a non-finite loss.
  Labels below 0 are the ignore value of a per-position task."""
  vocab = task.vocab_size_for(options)
  classes = vocab if task.per_position else task.num_classes
  for split, (inputs, labels) in splits.items():
    for name, array, low, high in (
      ('token id', inputs, 0, vocab),
      ('label', labels, None if task.per_position else 0, classes),
    ):
      a = np.asarray(array)
      if not a.size:
        continue
      lo, hi = a.min(), a.max()
      bad = (hi >= high) or (low is not None and lo < low)
      if not bad:
        continue
      flat = a.reshape(len(a), -1)
      rows = (flat >= high).any(axis=1)
      if low is not None:
        rows |= (flat < low).any(axis=1)
      i = int(np.argmax(rows))
      row = flat[i]
      value = row[(row >= high) | ((row < low) if low is not None else False)][
        0
      ]
      kind = 'inputs' if name == 'token id' else 'labels'
      raise UserError(
        f'{os.path.join(path, f"{split}_{kind}.npy")}: record {i} has '
        f'{name} {int(value)}, outside [{0 if low is not None else "-"}, '
        f'{high}) for this task; rebuild the cache (`{rebuild} --force`) or '
        'check the data options.'
      )


def data_source(config, task):
  """'generated' or 'release': whether the run's cache was generated here
  (lra/data/listops.py, lra/data/pathfinder_gen.py) or converted from
  published files (the LRA release, IMDB, CIFAR-10), from the cache's
  info.json; 'unknown' when that file is missing."""
  data_dir = config.data_dir or tasks.default_data_dir()
  path = os.path.join(
    task.cache_dir(data_dir, config.data.to_dict()), 'info.json'
  )
  try:
    with open(path) as f:
      info = json.load(f)
  except (OSError, ValueError):
    return 'unknown'
  # Converted tasks (text, retrieval, image) record where they read from
  # ('archive', 'folders', 'tfds' or nothing); only generators write this.
  return 'generated' if info.get('source') == 'generated' else 'release'


def _tty(stream):
  """Whether `stream` is a terminal (False for a file, a pipe, a capture)."""
  isatty = getattr(stream, 'isatty', None)
  return bool(isatty and isatty())


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
  lm = objectives.is_lm(config)
  task = tasks.get_task(config.task) if lm else None
  for index, batch in enumerate(
    tqdm(
      batches,
      desc=desc,
      leave=False,
      # Not on a file or a pipe: a bar there is carriage returns and
      # cursor codes (the training loop prints its plain lines instead).
      disable=not desc or not processes.is_primary() or not _tty(sys.stderr),
      total=batching.num_eval_batches(len(labels), size),
    )
  ):
    if lm:
      batch = objectives.lm_batch(batch, config, task)
    # masked_lm: the masks are drawn in the step from (seed, batch number),
    # the same at every evaluation (eval_step made with objectives.in_step).
    key = objectives.eval_key(config, index)
    sums = eval_step(state, to_device(batch, batch_sharding), key)
    # Summed on the device (float32, as on the host before: the same
    # numbers), read back once at the end: no sync per batch.
    total = sums if total is None else jax.tree.map(jnp.add, total, sums)
  return objectives.finish(jax.device_get(total), config)
