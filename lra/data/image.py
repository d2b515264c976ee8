"""Grayscale CIFAR-10 (LRA Image): 10-way classification of 1,024 pixels.

Splits as LRA (TFDS `train[:90%]`, `train[90%:]`, `test`): the first 90% of
the training images (45,000) train, the last 10% (5,000) validate, the
10,000 test images test (the boundary rounded as TFDS rounds it). Each
image becomes 1,024 gray levels (row-major), uint8, vocab 256. Black (0) is
a real pixel, never padding.

Gray level: the reference's tf.image.rgb_to_grayscale, reproduced in float32
numpy: g = 0.2989 R' + 0.5870 G' + 0.1140 B' with R' = R / 255 (float32),
then uint8(g * 255.5), truncated. So white stays 255 and pure red gives 76
(np.rint(0.2989 * 255) would also give 76, but pure green gives 149 here and
150 with rounding): levels match TensorFlow's up to float32 summation order.

Sources, looked for in this order:
  archive  <data_dir>/image/cifar-10-python.tar.gz, batches read from the
           tar directly;
  folders  <data_dir>/image/cifar-10-batches-py/{data_batch_1..5,test_batch}
           (unpacked);
  tfds     <TFDS data dir>/cifar10/<version>/ (TFDS prepared files, PNG
           images, read without TensorFlow; the TFDS data dir is
           $TFDS_DATA_DIR, else ~/tensorflow_datasets when it holds them,
           else <data_dir>/image/tensorflow_datasets: lra/data/release.py).
The train order (hence the validation images) is the source's: data_batch_1
to 5 for the python batches; for TFDS, each split as tfds.load(split,
shuffle_files=False) gives it (as the reference).
"""

import io
import os
import pickle
import tarfile
import zlib

import numpy as np
from PIL import Image
import tqdm

from lra.data import cache, release, tfrecord
from lra.errors import UserError

ARCHIVE = 'cifar-10-python.tar.gz'
URL = 'https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz'
FOLDER = 'cifar-10-batches-py'
TRAIN_BATCHES = tuple(f'data_batch_{i}' for i in range(1, 6))
BATCHES = TRAIN_BATCHES + ('test_batch',)
TRAIN_PERCENT = 90  # train[:90%], val train[90%:], as TFDS slices
WEIGHTS = (0.2989, 0.5870, 0.1140)  # R, G, B, as tf.image.rgb_to_grayscale
_PIXELS = 32 * 32


def _source(options):
  return release.check_source(options.get('source', 'auto'))


def cache_name(options):
  source = _source(options)
  return 'gray' + ('' if source == 'auto' else f'_{source}')


def grayscale(rgb):
  """uint8 [..., 3] RGB -> uint8 [...] gray, as tf.image.rgb_to_grayscale."""
  x = rgb.astype(np.float32) * np.float32(1 / 255)
  w = np.asarray(WEIGHTS, np.float32)
  gray = x[..., 0] * w[0] + x[..., 1] * w[1] + x[..., 2] * w[2]
  return (gray * np.float32(255.5)).astype(np.uint8)


class _BatchUnpickler(pickle.Unpickler):
  """Loads a CIFAR python batch and refuses any other object (a pickle can
  run code; these are the only globals a genuine batch refers to)."""

  _ALLOWED = {
    ('numpy.core.multiarray', '_reconstruct'),
    ('numpy._core.multiarray', '_reconstruct'),
    ('numpy', 'ndarray'),
    ('numpy', 'dtype'),
    ('_codecs', 'encode'),  # bytes as pickled by Python 3, protocol 2
  }

  def find_class(self, module, name):
    if (module, name) not in self._ALLOWED:
      raise pickle.UnpicklingError(f'unexpected global {module}.{name}')
    return super().find_class(module, name)


def _labels(labels, n, where):
  labels = list(labels)
  if len(labels) != n:
    raise UserError(f'{where}: {len(labels)} labels for {n} images.')
  for i, y in enumerate(labels):
    if not isinstance(y, (int, np.integer)) or not 0 <= y < 10:
      raise UserError(f'{where}: label {i} is {y!r}, expected 0 to 9.')
  return np.asarray(labels, np.int32)


def decode_batch(raw, where):
  """A pickled python batch -> (gray uint8 [N, 1024], labels int32 [N])."""
  try:
    batch = _BatchUnpickler(io.BytesIO(raw), encoding='bytes').load()
  except (pickle.UnpicklingError, EOFError, ValueError, TypeError) as e:
    raise UserError(
      f'{where} is not a CIFAR-10 python batch ({e}); fetch {ARCHIVE} again.'
    ) from None
  if not isinstance(batch, dict) or not {b'data', b'labels'} <= set(batch):
    raise UserError(f"{where} has no b'data' and b'labels'; wrong file?")
  data = batch[b'data']
  if (
    not isinstance(data, np.ndarray)
    or data.dtype != np.uint8
    or data.ndim != 2
    or data.shape[1] != 3 * _PIXELS
  ):
    shape = getattr(data, 'shape', type(data).__name__)
    raise UserError(
      f"{where}: b'data' is {shape} {getattr(data, 'dtype', '')}, expected "
      'uint8 [N, 3072] (32x32 R, G, B planes); wrong file?'
    )
  labels = _labels(batch[b'labels'], len(data), where)
  rgb = data.reshape(-1, 3, _PIXELS).transpose(0, 2, 1)
  return grayscale(rgb), labels


def _read_archive(path):
  wanted = {f'{FOLDER}/{b}' for b in BATCHES}
  raw = {}
  try:
    with tarfile.open(path, 'r:*') as tar:
      for member in tar:
        name = member.name.removeprefix('./')
        if name in wanted and member.isfile():
          raw[name.rsplit('/', 1)[1]] = tar.extractfile(member).read()
  except (tarfile.TarError, OSError, EOFError, zlib.error) as e:
    raise UserError(
      f'Cannot read {path} ({e}); download {ARCHIVE} ({URL}) again.'
    ) from None
  for b in BATCHES:
    if b not in raw:
      raise UserError(f'{path} has no {FOLDER}/{b}; download it again.')
  return {b: (raw[b], f'{path}:{FOLDER}/{b}') for b in BATCHES}


def _read_folder(folder):
  raw = {}
  for b in BATCHES:
    path = os.path.join(folder, b)
    try:
      with open(path, 'rb') as f:
        raw[b] = f.read(), path
    except OSError as e:
      raise UserError(
        f'Cannot read {path} ({e}); unpack {ARCHIVE} ({URL}) again.'
      ) from None
  return raw


def _decode_png(png, where):
  try:
    with Image.open(io.BytesIO(png)) as im:
      if im.size != (32, 32) or im.mode != 'RGB':
        raise UserError(
          f'{where}: image is {im.size[0]}x{im.size[1]} {im.mode}, expected '
          '32x32 RGB; is this cifar10?'
        )
      return np.asarray(im).reshape(_PIXELS, 3)
  except (OSError, SyntaxError, ValueError) as e:
    raise UserError(f'{where}: cannot decode the image ({e}).') from None


def _read_tfds(files, progress):
  """{'train', 'val', 'test': (gray, labels)}: TFDS's `train[:90%]`,
  `train[90%:]` and `test`, each in the order tfds.load(split,
  shuffle_files=False) gives it (tfrecord.tfds_order)."""
  shards = {}
  for split, paths in files.items():
    shards[split] = []
    for path in paths:
      rgb, labels = [], []
      for i, features in tqdm.tqdm(
        tfrecord.read_examples(path),
        desc=f'reading {os.path.basename(path)}',
        unit=' images',
        disable=not progress,
      ):
        png = tfrecord.feature(features, 'image', path, i)
        label = tfrecord.feature(features, 'label', path, i)
        if not isinstance(label, int) or not 0 <= label < 10:
          raise UserError(
            f'{path}: record {i} has label {label!r}, expected 0 to 9.'
          )
        if not isinstance(png, bytes):
          raise UserError(f'{path}: record {i}: image is not PNG bytes.')
        rgb.append(_decode_png(png, f'{path}: record {i}'))
        labels.append(label)
      gray = grayscale(np.stack(rgb)) if rgb else np.zeros((0, _PIXELS))
      shards[split].append((gray.astype(np.uint8), labels))

  def select(split, start=0, stop=None):
    parts = shards[split]
    order = tfrecord.tfds_order([len(y) for _, y in parts], start, stop)
    gray = np.zeros((len(order), _PIXELS), np.uint8)
    for row, (s, i) in enumerate(order):
      gray[row] = parts[s][0][i]
    return gray, np.asarray([parts[s][1][i] for s, i in order], np.int32)

  n = sum(len(y) for _, y in shards['train'])
  num_train = tfrecord.tfds_boundary(TRAIN_PERCENT, n)
  return {
    'train': select('train', 0, num_train),
    'val': select('train', num_train),
    'test': select('test'),
  }


def _from_batches(raw, progress):
  decoded = {
    b: decode_batch(*raw[b])
    for b in tqdm.tqdm(BATCHES, desc='decoding batches', disable=not progress)
  }
  train = [decoded[b] for b in TRAIN_BATCHES]
  return {
    'train': (
      np.concatenate([x for x, _ in train]),
      np.concatenate([y for _, y in train]),
    ),
    'test': decoded['test_batch'],
  }


def _find_source(data_dir, source, progress):
  """Returns (source name, path, {'train', 'test'[, 'val']: (x, y)}):
  TFDS is split already, the python batches are split by prepare."""
  root = os.path.join(data_dir, 'image')
  paths = {
    'archive': os.path.join(root, ARCHIVE),
    'folders': os.path.join(root, FOLDER),
  }
  return release.find(
    source,
    paths,
    {
      'archive': lambda path: _from_batches(_read_archive(path), progress),
      'folders': lambda path: _from_batches(_read_folder(path), progress),
      'tfds': lambda files: _read_tfds(files, progress),
    },
    task='image',
    data_dir=data_dir,
    dataset='CIFAR-10',
    archive=ARCHIVE,
    url=URL,
  )


def prepare(cache_dir, data_dir, options, progress=True):
  """Converts CIFAR-10 into the gray cache: train, val and test splits."""
  source, path, splits = _find_source(data_dir, _source(options), progress)
  if 'val' not in splits:  # the python batches: data_batch_1 to 5 in order
    inputs, labels = splits['train']
    num_train = tfrecord.tfds_boundary(TRAIN_PERCENT, len(labels))
    splits['train'] = inputs[:num_train], labels[:num_train]
    splits['val'] = inputs[num_train:], labels[num_train:]
  os.makedirs(cache_dir, exist_ok=True)
  cache.write_info(
    cache_dir,
    task='image',
    source=source,
    source_path=path,
    pixels='gray levels 0-255, row-major 32x32; 0 is black, not padding',
    grayscale='uint8(255.5 * (0.2989 R + 0.5870 G + 0.1140 B) / 255)',
    sizes={s: len(splits[s][1]) for s in cache.SPLITS},
  )
  for split in cache.SPLITS:
    cache.save_split(cache_dir, split, *splits[split])
