"""Compact per-split caches: `<dir>/<split>_inputs.npy` + `<split>_labels.npy`.

Inputs are uint8 or int16 token ids (0 = padding), [N, L] or [N, 2, L] for
two-document tasks; labels are int32 [N]. Arrays are read memory-mapped, so
training touches only the rows of the current batch.

`<split>_meta.json` records each array's shape, dtype, file size and a cheap
checksum (CRC-32 of its first and last 64 KiB). `load_split` checks them (and,
for caches written before the record existed, that each file is as long as
its .npy header says) and raises CacheError naming the damaged file; the
caller rebuilds the cache (generated tasks) or names the command that does.
"""

import contextlib
import json
import os
import sys
import zlib

import numpy as np

from lra import commands
from lra.errors import UserError

SPLITS = ('train', 'val', 'test')
_CHECKSUM_BYTES = 1 << 16


class CacheError(UserError):
  """A cache file is truncated, damaged or does not match its record."""

  def __init__(self, path, problem):
    super().__init__(f'{path} {problem}')
    self.path, self.problem = path, problem


def _checksum(path):
  """CRC-32 of the first and last 64 KiB (cheap for any size)."""
  size = os.path.getsize(path)
  with open(path, 'rb') as f:
    crc = zlib.crc32(f.read(_CHECKSUM_BYTES))
    if size > _CHECKSUM_BYTES:
      f.seek(max(_CHECKSUM_BYTES, size - _CHECKSUM_BYTES))
      crc = zlib.crc32(f.read(), crc)
  return crc


@contextlib.contextmanager
def preparing(cache_dir, say=True):
  """Holds an exclusive advisory lock on <cache_dir>.lock for the block (one
  process writes a cache at a time; the lock goes with its process, so a
  killed one leaves none held; the file is removed when the block ends).
  Says once when it waits for another. The caller re-checks the cache
  inside the block."""
  try:
    import fcntl  # pylint: disable=g-import-not-at-top
  except ImportError:  # not POSIX: no lock
    yield
    return
  parent = os.path.dirname(os.path.abspath(cache_dir))
  os.makedirs(parent, exist_ok=True)
  path = os.path.abspath(cache_dir) + '.lock'
  said = not say
  while True:
    f = open(path, 'a')
    try:
      fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      if not said:
        print(
          f'Waiting for another process preparing {cache_dir} ...',
          file=sys.stderr,
          flush=True,
        )
        said = True
      fcntl.flock(f, fcntl.LOCK_EX)
    # The holder before us removes the file as it lets go: a lock on a
    # removed file excludes nobody (a newcomer makes a new one), so lock
    # again until the locked file is the one at the path.
    try:
      same = os.stat(path).st_ino == os.fstat(f.fileno()).st_ino
    except FileNotFoundError:
      same = False
    if same:
      break
    f.close()
  with f:
    try:
      yield
    finally:
      # Removed by its holder (the data folder keeps only data) while it
      # still holds the lock; waiters on it then lock the new file.
      try:
        os.remove(path)
      except OSError:
        pass
      fcntl.flock(f, fcntl.LOCK_UN)


# The endings of the files a prepare writes before renaming them into place.
PARTIAL = ('.tmp', '.tmp2')


def remove_partial(cache_dir):
  """Deletes the unfinished files (PARTIAL) a prepare left in `cache_dir`
  when it stopped (a full disk, an error, Ctrl-C): they are never read,
  and on a full disk they hold the space the user needs back."""
  if not os.path.isdir(cache_dir):
    return
  for name in os.listdir(cache_dir):
    if name.endswith(PARTIAL):
      try:
        os.remove(os.path.join(cache_dir, name))
      except OSError:
        pass


def _replace_or_remove(write, tmp, path):
  """Calls write(tmp), then renames tmp to path; a failure removes tmp."""
  try:
    write(tmp)
    os.replace(tmp, path)
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)


def save_split(cache_dir, split, inputs, labels):
  """Writes one split atomically (tmp file + rename), so a crash never leaves
  a truncated cache that looks complete; then its record."""
  labels = np.asarray(labels, np.int32)
  if len(inputs) != len(labels):
    raise ValueError(f'{len(inputs)} inputs but {len(labels)} labels')
  if not len(labels):
    raise UserError(
      f'The {split} split for {cache_dir} has no examples; check that split'
      "'s source file (it may hold only a header) and fetch it again."
    )
  os.makedirs(cache_dir, exist_ok=True)
  for name, arr in (('inputs', inputs), ('labels', labels)):
    path = os.path.join(cache_dir, f'{split}_{name}.npy')
    tmp = f'{path}.{os.getpid()}.tmp'

    def write(name, arr=arr):
      with open(name, 'wb') as f:
        np.save(f, arr)

    _replace_or_remove(write, tmp, path)
  write_record(cache_dir, split)


def write_record(cache_dir, split):
  """Records the split's shapes, sizes and checksums (<split>_meta.json);
  for writers that produce the .npy files themselves."""
  meta = {}
  for name in ('inputs', 'labels'):
    path = os.path.join(cache_dir, f'{split}_{name}.npy')
    shape, dtype, _ = _header(path)
    meta[name] = {
      'shape': list(shape),
      'dtype': str(dtype),
      'bytes': os.path.getsize(path),
      'crc32_head_tail': _checksum(path),
    }
  path = os.path.join(cache_dir, f'{split}_meta.json')

  def write(name):
    with open(name, 'w') as f:
      json.dump(meta, f, indent=1, sort_keys=True)

  _replace_or_remove(write, path + '.tmp', path)


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


def _header(path):
  """(shape, dtype, data offset) of a .npy file; raises CacheError."""
  try:
    with open(path, 'rb') as f:
      version = np.lib.format.read_magic(f)
      read = (
        np.lib.format.read_array_header_1_0
        if version == (1, 0)
        else np.lib.format.read_array_header_2_0
      )
      shape, _, dtype = read(f)
      return shape, dtype, f.tell()
  except (ValueError, EOFError, OSError) as e:
    raise CacheError(path, f'has no valid .npy header ({e})') from None


def verify_split(cache_dir, split):
  """Raises CacheError unless the split's files match their headers and
  their record (<split>_meta.json, when present)."""
  record_path = os.path.join(cache_dir, f'{split}_meta.json')
  record = None
  if os.path.exists(record_path):
    try:
      with open(record_path) as f:
        record = json.load(f)
    except (OSError, ValueError):
      raise CacheError(record_path, 'is not valid JSON') from None
  lengths = []
  for name in ('inputs', 'labels'):
    path = os.path.join(cache_dir, f'{split}_{name}.npy')
    shape, dtype, offset = _header(path)
    size = os.path.getsize(path)
    want = offset + int(np.prod(shape)) * dtype.itemsize
    if size != want:
      raise CacheError(
        path, f'is truncated or damaged ({size:,} bytes, {want:,} expected)'
      )
    lengths.append(shape[0] if shape else -1)
    rec = (record or {}).get(name)
    if rec is None:
      continue
    if list(shape) != rec['shape'] or str(dtype) != rec['dtype']:
      raise CacheError(
        path,
        f'holds {str(dtype)} {list(shape)}, not the {rec["dtype"]} '
        f'{rec["shape"]} recorded',
      )
    if size != rec['bytes'] or _checksum(path) != rec['crc32_head_tail']:
      raise CacheError(path, 'does not match its recorded checksum')
  if lengths[0] != lengths[1]:
    raise CacheError(
      os.path.join(cache_dir, f'{split}_labels.npy'),
      f'has {lengths[1]} labels for {lengths[0]} inputs',
    )


def load_split(cache_dir, split):
  """Returns (inputs, labels); inputs memory-mapped. Raises CacheError when
  a file is damaged."""
  if not has_split(cache_dir, split):
    raise UserError(
      f'No cached {split!r} split in {cache_dir}; run '
      f'`{commands.program("prepare")} <task> --data_dir DIR` first.'
    )
  verify_split(cache_dir, split)
  inputs = np.load(
    os.path.join(cache_dir, f'{split}_inputs.npy'), mmap_mode='r'
  )
  labels = np.load(os.path.join(cache_dir, f'{split}_labels.npy'))
  return inputs, labels
