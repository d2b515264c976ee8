"""Stateless batches: the batch at a step is a function of (seed, step).

Training order is a seeded permutation per epoch, so resuming at step s needs
no iterator state and gives exactly the batches an uninterrupted run would.
Evaluation walks a split in order; the last batch is padded with weight-0
rows so no example is dropped or counted twice.

Each host builds only its own rows of the global batch (multi-host ready).
A training step's batch (training_batches) is that draw cropped by the
length curriculum and turned into an LM objective's inputs; random_batch is
the same on random data (the benchmark's and the sweep probe's cells).

Labels are int [N] (a class per example) or, for a task with a label per
position (lra/data/mqar.py), int [N, L] with IGNORE (-100) where a
position is not labelled: the batch then holds labels [B, L] (IGNORE
replaced by 0) and weights [B, L] (the row's weight where labelled, else
0), cut or padded to the length as the inputs are.
"""

import functools
from typing import Callable

import jax
from ml_collections import ConfigDict
import numpy as np

from lra import data as tasks
from lra.train import curriculum, objectives

IGNORE = -100  # a per-position label that counts nothing


def fit_length(inputs, length, fill=0):
  """Cuts or pads (with `fill`, default 0) the last axis to `length`."""
  width = inputs.shape[-1]
  if width >= length:
    return np.asarray(inputs[..., :length])
  pad = [(0, 0)] * (inputs.ndim - 1) + [(0, length - width)]
  return np.pad(np.asarray(inputs), pad, constant_values=fill)


def targets(labels, weights_N, length):
  """(labels, weights) of a batch: a label per example [N] as it is, with
  the row weights; per-position labels [N, L] fitted to `length`, IGNORE
  made 0 with weight 0, weights [N, L] = the row's weight where labelled."""
  labels = np.asarray(labels)
  if labels.ndim == 1:
    return labels.astype(np.int32), weights_N
  labels_NxL = fit_length(labels, length, fill=IGNORE)
  labelled_NxL = labels_NxL != IGNORE
  weights_NxL = labelled_NxL * np.asarray(weights_N, np.float32)[:, None]
  return np.where(labelled_NxL, labels_NxL, 0).astype(np.int32), weights_NxL


@functools.lru_cache(maxsize=4)
def _permutation(seed, epoch, n):
  return np.random.default_rng([seed, epoch, 0x1EA]).permutation(n)


def train_indices(seed, step, global_batch, n):
  """Example indices of the global batch at `step` (crosses epoch ends)."""
  first = step * global_batch
  epoch = first // n
  if (first + global_batch - 1) // n == epoch:  # one epoch: a slice of it
    begin = first - epoch * n
    return _permutation(seed, epoch, n)[begin : begin + global_batch].astype(
      np.int64
    )
  flat = first + np.arange(global_batch, dtype=np.int64)
  epochs, pos = flat // n, flat % n
  out = np.empty(global_batch, np.int64)
  for e in np.unique(epochs):
    sel = epochs == e
    out[sel] = _permutation(seed, int(e), n)[pos[sel]]
  return out


def host_slice(global_batch, process_index, process_count):
  per_host = global_batch // process_count
  return slice(process_index * per_host, (process_index + 1) * per_host)


def train_batch(
  inputs,
  labels,
  *,
  seed,
  step,
  global_batch,
  length,
  process_index=0,
  process_count=1,
):
  # A plain view of a memory map: its rows index without the subclass's
  # per-array bookkeeping (a third of the draw's time).
  inputs = np.asarray(inputs)
  idx = train_indices(seed, step, global_batch, len(labels))
  # Sorted reads are faster on a memory map. The global batch is sorted
  # before each process takes its rows, so every row holds the same example
  # (and meets the same dropout mask) with any number of processes.
  idx = np.sort(idx)[host_slice(global_batch, process_index, process_count)]
  batch_labels, weights = targets(
    labels[idx], np.ones(len(idx), np.float32), length
  )
  return {
    'inputs': fit_length(inputs[idx], length).astype(np.int32),
    'labels': batch_labels,
    'weights': weights,
  }


def eval_batches(
  inputs, labels, *, global_batch, length, process_index=0, process_count=1
):
  """Yields every example once; the last batch is padded with weight 0."""
  n = len(labels)
  rows = host_slice(global_batch, process_index, process_count)
  for start in range(0, n, global_batch):
    idx = np.arange(start, start + global_batch)[rows]
    real = idx < n
    idx = np.where(real, idx, 0)
    batch_labels, weights = targets(
      labels[idx], real.astype(np.float32), length
    )
    yield {
      'inputs': fit_length(inputs[idx], length).astype(np.int32),
      'labels': batch_labels,
      'weights': weights,
    }


def num_eval_batches(n, global_batch):
  return -(-n // global_batch)


# ------------------------------------------------- a training step's batch
def training_batch(
  config: ConfigDict, task: tasks.Task, data: dict, stages: list, step: int
) -> dict[str, np.ndarray]:
  """The host's rows of the batch of 0-based `step`: a stateless draw of
  (seed, step) (lra/train/batching.py), cropped by the length curriculum
  (Shortformer's: a crop of the same rows) and turned into an LM
  objective's batch (masked_lm: the documents, masked in the step)."""
  return training_batches(config, task, data, stages)(step)


def random_batch(config, task, seed=0):
  """The host batch of a training step of `config`, on random data: random
  tokens (ids 1..vocab-1, so nothing is padding) and labels of the task's
  shapes, through training_batch (an LM objective's inputs, targets
  and masks). No length curriculum: the cell is the full length."""
  rng = np.random.default_rng(seed)
  b, length = config.batch_size, config.max_length
  options = config.data.to_dict()
  vocab = task.vocab_size_for(options)
  docs = (task.num_inputs,) if task.num_inputs > 1 else ()
  inputs = rng.integers(1, vocab, (b, *docs, length), dtype=np.int32)
  if task.per_position:
    labels = rng.integers(0, vocab, (b, length), dtype=np.int32)
  else:
    labels = rng.integers(0, task.num_classes, (b,), dtype=np.int32)
  return training_batch(config, task, {'train': (inputs, labels)}, [], 0)


def training_batches(
  config: ConfigDict, task: tasks.Task, data: dict, stages: list
) -> Callable[[int], dict[str, np.ndarray]]:
  """training_batch(config, task, data, stages, step) as a function of the
  step alone, the config's values read once (the loop draws a batch a
  step, and a ConfigDict lookup is a Python call chain)."""
  index, count = jax.process_index(), jax.process_count()
  seed, batch_size = config.seed, config.batch_size
  max_length = config.max_length
  rows = host_slice(batch_size, index, count)
  lm = objectives.is_lm(config)
  if stages:
    pad_id = 0 if config.data.get('black_is_padding') else task.pad_id
  inputs, labels = data['train']

  def make(step):
    batch = train_batch(
      inputs,
      labels,
      seed=seed,
      step=step,
      global_batch=batch_size,
      length=max_length,
      process_index=index,
      process_count=count,
    )
    if stages:
      batch['inputs'] = curriculum.crop(
        batch['inputs'],
        curriculum.length_at(stages, step + 1, max_length),
        windows=lm,
        seed=seed,
        step=step,
        pad_id=pad_id,
        rows=rows,
        global_rows=batch_size,
      )
    if lm:  # masked_lm: plain tokens, masked in the step (objectives.in_step)
      batch = objectives.lm_batch(batch, config, task)
    return batch

  return make
