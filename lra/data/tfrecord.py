"""TFRecord files of tf.train.Example protos, read without TensorFlow.

Reads the files of a prepared TensorFlow Datasets (TFDS) directory. A record
is framed as: uint64 length, uint32 masked CRC-32C of the length, the data,
uint32 masked CRC-32C of the data (all little-endian). The Example proto is
decoded with a minimal protobuf wire-format parser:

  Example { Features features = 1; }
  Features { map<string, Feature> feature = 1; }
  Feature { oneof { BytesList = 1; FloatList = 2; Int64List = 3; } }
  *List { repeated value = 1; }  (numbers packed or not)
"""

import glob
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
  google-cloud dependency); None when neither imports. About 100x faster
  than the pure-Python table."""
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


def tfds_files(dataset_dir, prefix, splits):
  """Finds the shards of the newest prepared version that has every split.

  Args:
    dataset_dir: `<tfds data dir>/<name>[/<config>]`, holding version dirs.
    prefix: the dataset name in the file names, e.g. 'imdb_reviews'.
    splits: e.g. ('train', 'test').

  Returns:
    {split: shard paths in shard order (as TFDS reads them)}, or None.
  """
  if not os.path.isdir(dataset_dir):
    return None
  versions = [
    v for v in os.listdir(dataset_dir) if re.fullmatch(r'\d+(\.\d+)*', v)
  ]
  for version in sorted(versions, key=_version_key, reverse=True):
    root = glob.escape(os.path.join(dataset_dir, version))
    files = {
      s: sorted(glob.glob(os.path.join(root, f'{prefix}-{s}.tfrecord-*')))
      for s in splits
    }
    if all(files.values()):
      return files
  return None
