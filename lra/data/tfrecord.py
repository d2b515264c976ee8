"""TFRecord files of tf.train.Example protos, read without TensorFlow.

Reads the files of a prepared TensorFlow Datasets (TFDS) directory
(tfds_files), in the order tfds.load(..., shuffle_files=False) gives their
examples (tfds_order). A record is framed as: uint64 length, uint32 masked
CRC-32C of the length, the data, uint32 masked CRC-32C of the data (all
little-endian). The Example proto is decoded with a minimal protobuf
wire-format parser:

  Example { Features features = 1; }
  Features { map<string, Feature> feature = 1; }
  Feature { oneof { BytesList = 1; FloatList = 2; Int64List = 3; } }
  *List { repeated value = 1; }  (numbers packed or not)
"""

import itertools
import os
import re
import struct

import numpy as np

from lra.errors import UserError

_CASTAGNOLI = 0x82F63B78  # CRC-32C polynomial, bit-reversed
_MASK_DELTA = 0xA282EAD8


def _crc_table():
  table = []
  for i in range(256):
    c = i
    for _ in range(8):
      c = (c >> 1) ^ _CASTAGNOLI if c & 1 else c >> 1
    table.append(c)
  return table


_TABLE = _crc_table()


def _crc32c_python(data):
  crc, table = 0xFFFFFFFF, _TABLE
  for b in data:
    crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
  return crc ^ 0xFFFFFFFF


def _native_crc32c():
  """(name, CRC-32C function) of the installed native package: `crc32c`
  (requirements.txt installs it) or `google_crc32c` (often present as a
  google-cloud dependency); None when neither imports. Far faster than
  the pure-Python table."""
  try:
    import crc32c as native  # pylint: disable=g-import-not-at-top

    return 'crc32c', lambda data: native.crc32c(bytes(data))
  except ImportError:
    pass
  try:
    import google_crc32c  # pylint: disable=g-import-not-at-top

    return 'google_crc32c', lambda data: google_crc32c.value(bytes(data))
  except ImportError:
    return None


_NATIVE = _native_crc32c()
# Which implementation crc32c is: 'crc32c', 'google_crc32c' or 'python'.
CRC32C_SOURCE = _NATIVE[0] if _NATIVE else 'python'
crc32c = _NATIVE[1] if _NATIVE else _crc32c_python
crc32c.__doc__ = 'CRC-32C (Castagnoli) of `data` (bytes-like).'


def masked_crc(data):
  """The CRC that TFRecord stores: rotated right by 15 bits, plus a delta."""
  crc = crc32c(data)
  return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def read_records(path):
  """Yields the data of each record of a TFRecord file, checking its CRCs."""
  with open(path, 'rb') as f:
    index = 0
    while True:
      header = f.read(12)
      if not header:
        return
      where = f'{path}: record {index}'
      if len(header) < 12:
        raise UserError(f'{where} is truncated; fetch the file again.')
      length, length_crc = struct.unpack('<QI', header)
      if masked_crc(header[:8]) != length_crc:
        raise UserError(f'{where} has a bad length CRC; not a TFRecord file?')
      data = f.read(length)
      footer = f.read(4)
      if len(data) < length or len(footer) < 4:
        raise UserError(f'{where} is truncated; fetch the file again.')
      if masked_crc(data) != struct.unpack('<I', footer)[0]:
        raise UserError(f'{where} is corrupt (bad CRC); fetch it again.')
      yield data
      index += 1


def _varint(buf, pos):
  result = shift = 0
  while shift < 70:
    if pos >= len(buf):
      raise ValueError('truncated varint')
    b = buf[pos]
    pos += 1
    result |= (b & 0x7F) << shift
    if not b & 0x80:
      return result, pos
    shift += 7
  raise ValueError('varint longer than 10 bytes')


def _fields(buf):
  """Yields (field number, wire type, value) of a serialized message."""
  pos = 0
  while pos < len(buf):
    key, pos = _varint(buf, pos)
    number, wire = key >> 3, key & 7
    if wire == 0:
      value, pos = _varint(buf, pos)
    elif wire in (1, 2, 5):
      if wire == 2:
        size, pos = _varint(buf, pos)
      else:
        size = 8 if wire == 1 else 4
      value, pos = buf[pos : pos + size], pos + size
      if pos > len(buf):
        raise ValueError('truncated field')
    else:
      raise ValueError(f'unsupported wire type {wire}')
    yield number, wire, value


def _signed64(v):
  return v - (1 << 64) if v >= 1 << 63 else v


def _feature_values(feature):
  """A Feature's values: a list of bytes, of floats or of ints."""
  values = []
  for kind, _, payload in _fields(feature):
    for number, wire, value in _fields(payload):
      if number != 1:
        continue
      if kind == 1:  # BytesList
        values.append(bytes(value))
      elif kind == 2:  # FloatList: packed or one fixed32 at a time
        values.extend(np.frombuffer(value, '<f4').tolist())
      elif kind == 3 and wire == 0:  # Int64List, unpacked
        values.append(_signed64(value))
      elif kind == 3:  # Int64List, packed
        pos = 0
        while pos < len(value):
          v, pos = _varint(value, pos)
          values.append(_signed64(v))
  return values


def parse_example(data):
  """Decodes a serialized tf.train.Example into {name: list of values}."""
  out = {}
  for number, wire, features in _fields(memoryview(data)):
    if number != 1 or wire != 2:
      continue
    for number, wire, entry in _fields(features):
      if number != 1 or wire != 2:
        continue
      name, feature = b'', b''
      for n, w, value in _fields(entry):
        if n == 1 and w == 2:
          name = bytes(value)
        elif n == 2 and w == 2:
          feature = value
      out[name.decode('utf-8')] = _feature_values(feature)
  return out


def read_examples(path):
  """Yields (index, features) of each Example in a TFRecord file."""
  for index, data in enumerate(read_records(path)):
    try:
      yield index, parse_example(data)
    except (ValueError, UnicodeDecodeError) as e:
      raise UserError(
        f'{path}: record {index} is not a tf.train.Example ({e}).'
      ) from None


def feature(features, name, path, index):
  """The single value of feature `name`, or a UserError naming the record."""
  values = features.get(name)
  if values is None or len(values) != 1:
    found = 'missing' if values is None else f'{len(values)} values'
    raise UserError(
      f'{path}: record {index}: feature {name!r} is {found}, expected one '
      'value; is this the right TFDS dataset?'
    )
  return values[0]


def _version_key(name):
  return tuple(int(p) for p in name.split('.'))


def _shards(folder, prefix, split):
  """The complete shard set `<prefix>-<split>.tfrecord-<i>-of-<n>` in
  `folder`, in index order, or None when there is none or one is missing."""
  pattern = re.compile(
    rf'{re.escape(prefix)}-{re.escape(split)}\.tfrecord-(\d+)-of-(\d+)'
  )
  found = {}
  for name in os.listdir(folder):
    match = pattern.fullmatch(name)
    if match:
      found[int(match.group(1)), int(match.group(2))] = name
  counts = {n for _, n in found}
  if len(counts) != 1:
    return None
  (n,) = counts
  if sorted(i for i, _ in found) != list(range(n)):
    return None
  return [os.path.join(folder, found[i, n]) for i in range(n)]


def tfds_files(dataset_dir, prefix, splits):
  """Finds the shards of the newest prepared version that has every split.

  A version folder counts as prepared when it holds dataset_info.json and,
  for every split, the whole set of TFRecord shards
  `<prefix>-<split>.tfrecord-00000-of-<n>` to `...-<n - 1>-of-<n>` (what
  TensorFlow Datasets writes; it prepares into a temporary folder and
  renames it when done).

  Args:
    dataset_dir: `<tfds data dir>/<name>[/<config>]`, holding version dirs.
    prefix: the dataset name in the file names, e.g. 'imdb_reviews'.
    splits: e.g. ('train', 'test').

  Returns:
    {split: shard paths in shard index order}, or None.
  """
  if not os.path.isdir(dataset_dir):
    return None
  versions = [
    v for v in os.listdir(dataset_dir) if re.fullmatch(r'\d+(\.\d+)*', v)
  ]
  for version in sorted(versions, key=_version_key, reverse=True):
    root = os.path.join(dataset_dir, version)
    if not os.path.isfile(os.path.join(root, 'dataset_info.json')):
      continue
    files = {s: _shards(root, prefix, s) for s in splits}
    if all(files.values()):
      return files
  return None


# --------------------------------------------------- TFDS's reading order

# tfds.load(name, split=..., shuffle_files=False) reads a split's shards
# with tf.data.Dataset.interleave(cycle_length=16, block_length=16): the
# tfds.ReadConfig defaults for a dataset that does not disable shuffling
# (imdb_reviews, cifar10 do not), deterministic since the files are not
# shuffled. So with more than one shard the examples do not come shard
# after shard.
TFDS_CYCLE_LENGTH = 16
TFDS_BLOCK_LENGTH = 16
_END = object()


def interleave(sources, cycle_length, block_length):
  """Yields the items of the iterables `sources` in the order of
  tf.data.Dataset.interleave (deterministic): `cycle_length` slots, visited
  in turn; a visit yields up to `block_length` items of its slot's
  iterable; an empty slot takes the next iterable of `sources` when it is
  visited; an iterable found exhausted frees its slot and the turn passes
  to the next slot."""
  sources = iter(sources)
  slots = [None] * cycle_length
  more, open_slots, i = True, 0, 0
  while more or open_slots:
    if slots[i] is None and more:
      source = next(sources, _END)
      if source is not _END:
        slots[i] = iter(source)
        open_slots += 1
        continue
      more = False
    if slots[i] is not None:
      for _ in range(block_length):
        item = next(slots[i], _END)
        if item is _END:
          slots[i] = None
          open_slots -= 1
          break
        yield item
    i = (i + 1) % cycle_length


def tfds_boundary(percent, num_examples):
  """The example index of `percent`% in a TFDS split slice such as
  'train[:90%]' (TFDS's default 'closest' rounding)."""
  return int(round(percent * num_examples / 100.0))


def tfds_order(lengths, start=0, stop=None):
  """The (shard, record) pairs of examples [start, stop) of a split, in the
  order tfds.load(..., shuffle_files=False) yields them.

  TFDS slices a split by example count over its shards in index order
  (records in file order), which gives each shard a skip and a take, then
  interleaves those pieces (TFDS_CYCLE_LENGTH, TFDS_BLOCK_LENGTH).

  Args:
    lengths: the number of records of each shard, in shard index order.
    start, stop: the slice, in examples (stop None: the end).
  """
  stop = sum(lengths) if stop is None else stop
  pieces, offset = [], 0
  for shard, n in enumerate(lengths):
    lo, hi = max(start, offset), min(stop, offset + n)
    if lo < hi:
      pieces.append(
        zip(itertools.repeat(shard), range(lo - offset, hi - offset))
      )
    offset += n
  return list(interleave(pieces, TFDS_CYCLE_LENGTH, TFDS_BLOCK_LENGTH))
