"""Stateless batches: the batch at a step is a function of (seed, step).

Training order is a seeded permutation per epoch, so resuming at step s needs
no iterator state and gives exactly the batches an uninterrupted run would.
Evaluation walks a split in order; the last batch is padded with weight-0
rows so no example is dropped or counted twice.

Each host builds only its own rows of the global batch (multi-host ready).
"""

import functools

import numpy as np


def fit_length(inputs, length):
  """Cuts or zero-pads the last axis to `length`."""
  width = inputs.shape[-1]
  if width >= length:
    return np.asarray(inputs[..., :length])
  pad = [(0, 0)] * (inputs.ndim - 1) + [(0, length - width)]
  return np.pad(np.asarray(inputs), pad)


@functools.lru_cache(maxsize=4)
def _permutation(seed, epoch, n):
  return np.random.default_rng([seed, epoch, 0x1EA]).permutation(n)


def train_indices(seed, step, global_batch, n):
  """Example indices of the global batch at `step` (crosses epoch ends)."""
  flat = step * global_batch + np.arange(global_batch, dtype=np.int64)
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
  idx = train_indices(seed, step, global_batch, len(labels))
  # Sorted reads are faster on a memory map. The global batch is sorted
  # before each process takes its rows, so every row holds the same example
  # (and meets the same dropout mask) with any number of processes.
  idx = np.sort(idx)[host_slice(global_batch, process_index, process_count)]
  return {
    'inputs': fit_length(inputs[idx], length).astype(np.int32),
    'labels': np.asarray(labels[idx], np.int32),
    'weights': np.ones(len(idx), np.float32),
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
    yield {
      'inputs': fit_length(inputs[idx], length).astype(np.int32),
      'labels': np.asarray(labels[idx], np.int32),
      'weights': real.astype(np.float32),
    }


def num_eval_batches(n, global_batch):
  return -(-n // global_batch)
