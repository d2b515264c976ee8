"""Stateless batches: the batch at a step is a function of (seed, step).

Training order is a seeded permutation per epoch, so resuming at step s needs
no iterator state and gives exactly the batches an uninterrupted run would.
Evaluation walks a split in order; the last batch is padded with weight-0
rows so no example is dropped or counted twice.

Each host builds only its own rows of the global batch (multi-host ready).

Labels are int [N] (a class per example) or, for a task with a label per
position (lra/data/mqar.py), int [N, L] with IGNORE (-100) where a
position is not labelled: the batch then holds labels [B, L] (IGNORE
replaced by 0) and weights [B, L] (the row's weight where labelled, else
0), cut or padded to the length as the inputs are.
"""

import functools

import numpy as np

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
