"""Compact per-split caches: `<dir>/<split>_inputs.npy` + `<split>_labels.npy`.

Inputs are uint8 or int16 token ids (0 = padding), [N, L] or [N, 2, L] for
two-document tasks; labels are int32 [N]. Arrays are read memory-mapped, so
training touches only the rows of the current batch.
"""

import json
import os

import numpy as np

from lra.errors import UserError

SPLITS = ('train', 'val', 'test')


def save_split(cache_dir, split, inputs, labels):
  """Writes one split atomically (tmp file + rename), so a crash never leaves
  a truncated cache that looks complete."""
  os.makedirs(cache_dir, exist_ok=True)
  labels = np.asarray(labels, np.int32)
  if len(inputs) != len(labels):
    raise ValueError(f'{len(inputs)} inputs but {len(labels)} labels')
  for name, arr in (('inputs', inputs), ('labels', labels)):
    path = os.path.join(cache_dir, f'{split}_{name}.npy')
    with open(path + '.tmp', 'wb') as f:
      np.save(f, arr)
    os.replace(path + '.tmp', path)


def write_info(cache_dir, **info):
  with open(os.path.join(cache_dir, 'info.json'), 'w') as f:
    json.dump(info, f, indent=1, sort_keys=True)


def has_split(cache_dir, split):
  return all(
    os.path.exists(os.path.join(cache_dir, f'{split}_{n}.npy'))
    for n in ('inputs', 'labels')
  )


def is_complete(cache_dir):
  return all(has_split(cache_dir, s) for s in SPLITS)


def load_split(cache_dir, split):
  """Returns (inputs, labels); inputs memory-mapped."""
  if not has_split(cache_dir, split):
    raise UserError(
      f'No cached {split!r} split in {cache_dir}; run '
      '`python -m lra.prepare <task> --data_dir DIR` first.'
    )
  inputs = np.load(
    os.path.join(cache_dir, f'{split}_inputs.npy'), mmap_mode='r'
  )
  labels = np.load(os.path.join(cache_dir, f'{split}_labels.npy'))
  return inputs, labels
