"""Tiny datasets in the real release formats, for reader and training tests.

Each writer takes a task's data folder (`<data_dir>/text`, `.../retrieval`,
`.../image`) and writes one source there as a user would place it. Contents
are deterministic and include what real data has: non-ASCII UTF-8, reviews
longer than 4,000 bytes, whitespace that TFDS strips, black pixels, files a
reader must skip. `imdb_reviews`, `aan_rows` and `cifar_images` return the
content, so tests can compute what the cache must hold.

  write_release_data(data_dir)  # text, retrieval and image, ready to train
  write_pathfinder_release(data_dir, folder='curv_baseline')  # easy
"""

import io
import os
import pickle
import struct
import tarfile

import numpy as np
from PIL import Image

from lra.data.tfrecord import masked_crc

_POSITIVE = ['great', 'superb', 'loved', 'touching', 'brilliant', 'funny']
_NEGATIVE = ['awful', 'boring', 'hated', 'clumsy', 'dreadful', 'dull']
_COMMON = ['the', 'film', 'plot', 'café', 'naïve', 'Amélie', '東京', '😀', '—']


def _words(rng, vocab, n):
  return ' '.join(str(w) for w in rng.choice(vocab, n))


# ----------------------------------------------------------------- IMDB ----


def imdb_reviews(n_per_class=8, seed=0):
  """{split: [(label dir, file name, raw bytes)]}: 'neg'/'pos' reviews.

  Review 0 of each class is longer than 4,000 bytes; review 1 has the
  surrounding whitespace and <br /> tags of real reviews.
  """
  rng = np.random.default_rng(seed)
  out = {}
  for split in ('train', 'test'):
    rows = []
    for label in ('pos', 'neg'):
      vocab = (_POSITIVE if label == 'pos' else _NEGATIVE) + _COMMON
      for i in range(n_per_class):
        text = _words(rng, vocab, 900 if i == 0 else int(rng.integers(5, 60)))
        if i == 1:
          text = f'  {text}<br /><br />Ça va.\n'
        rating = rng.integers(7, 11) if label == 'pos' else rng.integers(1, 5)
        rows.append((label, f'{i}_{rating}.txt', text.encode('utf-8')))
    out[split] = rows
  return out


_IMDB_EXTRAS = {  # members a reader must skip
  'aclImdb/README': b'Large Movie Review Dataset v1.0\n',
  'aclImdb/imdb.vocab': b'the\nand\n',
  'aclImdb/train/labeledBow.feat': b'9 0:9 1:1\n',
  'aclImdb/train/urls_pos.txt': b'http://www.imdb.com/title/tt0453418/\n',
  'aclImdb/train/unsup/0_0.txt': b'An unlabelled review.',
}


def _imdb_files(n_per_class):
  files = dict(_IMDB_EXTRAS)
  for split, rows in imdb_reviews(n_per_class).items():
    for label, name, text in rows:
      files[f'aclImdb/{split}/{label}/{name}'] = text
  return files


def _write_tar(path, files, dirs=()):
  with tarfile.open(path, 'w:gz') as tar:
    for d in dirs:
      info = tarfile.TarInfo(d)
      info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, 0
      tar.addfile(info)
    for name, data in files.items():
      info = tarfile.TarInfo(name)
      info.size, info.mtime = len(data), 0
      tar.addfile(info, io.BytesIO(data))
  return path


def write_aclimdb_tar(folder, n_per_class=8):
  """`<folder>/aclImdb_v1.tar.gz`, as downloaded from Stanford."""
  os.makedirs(folder, exist_ok=True)
  path = os.path.join(folder, 'aclImdb_v1.tar.gz')
  return _write_tar(path, _imdb_files(n_per_class), dirs=['aclImdb/'])


def write_aclimdb_folders(folder, n_per_class=8):
  """`<folder>/aclImdb/...`, the archive unpacked."""
  for name, data in _imdb_files(n_per_class).items():
    path = os.path.join(folder, name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, 'wb') as f:
      f.write(data)
  return os.path.join(folder, 'aclImdb')


# ------------------------------------------------------- TFRecord / TFDS ----


def isolate_tfds(monkeypatch, tmp_path):
  """Tests never read the user's TFDS data: no $TFDS_DATA_DIR, and
  ~/tensorflow_datasets is an empty folder of the test's."""
  from lra.data import release

  monkeypatch.delenv('TFDS_DATA_DIR', raising=False)
  home = str(tmp_path / 'home' / 'tensorflow_datasets')
  monkeypatch.setattr(release, 'home_tfds_dir', lambda: home)


def _varint(v):
  v &= (1 << 64) - 1  # negative int64: ten bytes, two's complement
  out = bytearray()
  while v > 0x7F:
    out.append(v & 0x7F | 0x80)
    v >>= 7
  out.append(v)
  return bytes(out)


def _field(number, payload):
  """A length-delimited protobuf field."""
  return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def example(**features):
  """A serialized tf.train.Example of bytes and int64 features, encoded as
  TensorFlow does (Int64List packed)."""
  entries = b''
  for name, value in sorted(features.items()):
    if isinstance(value, bytes):
      feature = _field(1, _field(1, value))  # BytesList
    else:
      feature = _field(3, _field(1, _varint(value)))  # Int64List
    entries += _field(1, _field(1, name.encode()) + _field(2, feature))
  return _field(1, entries)


def write_tfrecord(path, records):
  """A TFRecord file: length, masked CRC, data, masked CRC per record."""
  with open(path, 'wb') as f:
    for data in records:
      length = struct.pack('<Q', len(data))
      f.write(length + struct.pack('<I', masked_crc(length)))
      f.write(data + struct.pack('<I', masked_crc(data)))
  return path


def _write_shards(folder, prefix, split, records, num_shards):
  os.makedirs(folder, exist_ok=True)
  for s in range(num_shards):
    name = f'{prefix}-{split}.tfrecord-{s:05d}-of-{num_shards:05d}'
    write_tfrecord(os.path.join(folder, name), records[s::num_shards])


def write_tfds_imdb(folder, n_per_class=8, version='1.0.0'):
  """`<folder>/tensorflow_datasets/imdb_reviews/plain_text/<version>/`.

  Records hold stripped text and label (neg 0, pos 1) in a shuffled order,
  train in two shards, plus the unsupervised split (label -1).
  """
  root = os.path.join(
    folder, 'tensorflow_datasets', 'imdb_reviews', 'plain_text', version
  )
  rng = np.random.default_rng(1)
  for split, rows in imdb_reviews(n_per_class).items():
    records = [
      example(text=text.strip(), label=int(label == 'pos'))
      for label, _, text in rows
    ]
    records = [records[i] for i in rng.permutation(len(records))]
    _write_shards(root, 'imdb_reviews', split, records, 2 - (split == 'test'))
  unsup = [example(text=b'An unlabelled review.', label=-1)]
  _write_shards(root, 'imdb_reviews', 'unsupervised', unsup, 1)
  with open(os.path.join(root, 'dataset_info.json'), 'w') as f:
    f.write('{"name": "imdb_reviews", "version": "%s"}\n' % version)
  return root


# ------------------------------------------------------------------ AAN ----


def aan_rows(n=16, seed=0):
  """[(label, id1, id2, text1, text2)] as bytes; texts 0 and 3 > 4 KB."""
  rng = np.random.default_rng(seed)
  vocab = ['we', 'propose', 'parsing', 'corpus', 'Müller', 'Žižek', '中文']
  rows = []
  for i in range(n):
    texts = [
      _words(rng, vocab, 800 if i in (0, 3) and j == i % 2 else 40).encode()
      for j in range(2)
    ]
    ids = [
      f'P{rng.integers(0, 99):02d}-{rng.integers(1000, 9999)}'.encode()
      for _ in range(2)
    ]
    rows.append((str(i % 2).encode(), *ids, *texts))
  return rows


def write_aan_tsv(folder, n=16, in_tsv_data=False):
  """`new_aan_pairs.{train,eval,test}.tsv` (no header, tab-separated)."""
  if in_tsv_data:
    folder = os.path.join(folder, 'tsv_data')
  os.makedirs(folder, exist_ok=True)
  for seed, split in enumerate(('train', 'eval', 'test')):
    with open(os.path.join(folder, f'new_aan_pairs.{split}.tsv'), 'wb') as f:
      for row in aan_rows(n, seed):
        f.write(b'\t'.join(row) + b'\n')
  return folder


# ------------------------------------------------------------- CIFAR-10 ----


def cifar_images(n_per_batch=16, seed=0):
  """(train RGB uint8 [5n, 32, 32, 3], train labels, test RGB, labels).

  Train image 0 is all black; image 1 is black but for a known top row:
  white, red, green, blue, (10, 20, 30). The others are random with black
  patches.
  """
  rng = np.random.default_rng(seed)
  rgb = rng.integers(0, 256, (6 * n_per_batch, 32, 32, 3), np.uint8)
  rgb[:, 8:12, 8:12] = 0
  rgb[0] = 0
  rgb[1] = 0
  rgb[1, 0, :5] = [
    [255] * 3,
    [255, 0, 0],
    [0, 255, 0],
    [0, 0, 255],
    [10, 20, 30],
  ]
  labels = rng.integers(0, 10, 6 * n_per_batch)
  n = 5 * n_per_batch
  return rgb[:n], labels[:n], rgb[n:], labels[n:]


def _cifar_batch(rgb, labels, name):
  batch = {
    b'batch_label': name.encode(),
    b'labels': [int(y) for y in labels],
    b'data': rgb.transpose(0, 3, 1, 2).reshape(len(rgb), 3072),
    b'filenames': [f'image_{i}.png'.encode() for i in range(len(rgb))],
  }
  # The real batches were pickled by Python 2 and NumPy 1 (numpy.core).
  data = pickle.dumps(batch, protocol=2)
  return data.replace(b'numpy._core.multiarray', b'numpy.core.multiarray')


def _cifar_files(n_per_batch):
  train, train_labels, test, test_labels = cifar_images(n_per_batch)
  files = {}
  for b in range(5):
    rows = slice(b * n_per_batch, (b + 1) * n_per_batch)
    name = f'data_batch_{b + 1}'
    files[name] = _cifar_batch(train[rows], train_labels[rows], name)
  files['test_batch'] = _cifar_batch(test, test_labels, 'testing batch')
  meta = {b'label_names': [b'airplane'] * 10, b'num_vis': 3072}
  files['batches.meta'] = pickle.dumps(meta, protocol=2)
  files['readme.html'] = b'<html></html>\n'
  return files


def write_cifar_tar(folder, n_per_batch=16):
  """`<folder>/cifar-10-python.tar.gz` (python version, 5 + 1 batches)."""
  os.makedirs(folder, exist_ok=True)
  files = {
    f'cifar-10-batches-py/{k}': v for k, v in _cifar_files(n_per_batch).items()
  }
  path = os.path.join(folder, 'cifar-10-python.tar.gz')
  return _write_tar(path, files, dirs=['cifar-10-batches-py'])


def write_cifar_folders(folder, n_per_batch=16):
  """`<folder>/cifar-10-batches-py/`, the archive unpacked."""
  root = os.path.join(folder, 'cifar-10-batches-py')
  os.makedirs(root, exist_ok=True)
  for name, data in _cifar_files(n_per_batch).items():
    with open(os.path.join(root, name), 'wb') as f:
      f.write(data)
  return root


def png(rgb):
  buf = io.BytesIO()
  Image.fromarray(rgb).save(buf, format='PNG')
  return buf.getvalue()


def write_tfds_cifar(folder, n_per_batch=16, version='3.0.2'):
  """`<folder>/tensorflow_datasets/cifar10/<version>/`: PNG images, in the
  python batches' order, train in two shards."""
  root = os.path.join(folder, 'tensorflow_datasets', 'cifar10', version)
  train, train_labels, test, test_labels = cifar_images(n_per_batch)
  for split, images, labels, shards in (
    ('train', train, train_labels, 2),
    ('test', test, test_labels, 1),
  ):
    records = [
      example(id=f'{split}_{i:05d}'.encode(), image=png(x), label=int(y))
      for i, (x, y) in enumerate(zip(images, labels))
    ]
    # Shard k holds a contiguous block; with at most 16 records a shard
    # (TFDS's interleave block) reading as TFDS does gives them in order.
    size = -(-len(records) // shards)
    os.makedirs(root, exist_ok=True)
    for s in range(shards):
      name = f'cifar10-{split}.tfrecord-{s:05d}-of-{shards:05d}'
      write_tfrecord(
        os.path.join(root, name), records[s * size : (s + 1) * size]
      )
  with open(os.path.join(root, 'dataset_info.json'), 'w') as f:
    f.write('{"name": "cifar10", "version": "%s"}\n' % version)
  return root


def pathfinder_images(n, res=32, seed=0):
  """uint8 [n, res * res]: distinct sparse images (mostly black pixels)."""
  rng = np.random.default_rng(seed)
  images = rng.integers(1, 256, (n, res * res)).astype(np.uint8)
  images[rng.random((n, res * res)) < 0.8] = 0
  images[:, 0] = np.arange(n)  # distinct even when n is large
  return images


def write_pathfinder_release(
  data_dir, task='pathfinder', res=32, folder='curv_contour_length_14', n=40
):
  """The Pathfinder release layout under `data_dir`/<task>/release/: one
  difficulty folder (curv_baseline = easy, curv_contour_length_9 / _14)
  with imgs/<k>/sample_<i>.png and metadata/<k>.npy TEXT files (one line
  per image: `imgs/<k> sample_<i>.png <i> <label> ...`), images alternately
  in k = 0 and 1, label i % 2. Returns (folder path, images [n, res**2])."""
  root = os.path.join(data_dir, task, 'release', f'pathfinder{res}', folder)
  images = pathfinder_images(n, res)
  lines = {0: [], 1: []}
  for i in range(n):
    k = i % 2
    os.makedirs(os.path.join(root, 'imgs', str(k)), exist_ok=True)
    name = f'sample_{i}.png'
    Image.fromarray(images[i].reshape(res, res)).save(
      os.path.join(root, 'imgs', str(k), name)
    )
    lines[k].append(f'imgs/{k} {name} {i} {i % 2} 1.0 14 4 2 0.5 1 1')
  os.makedirs(os.path.join(root, 'metadata'))
  for k, rows in lines.items():
    with open(os.path.join(root, 'metadata', f'{k}.npy'), 'w') as f:
      f.write('\n'.join(rows) + '\n')
  return root, images


def write_release_data(data_dir):
  """One source per converted task under `data_dir`, ready for training:
  text 16 + 16 reviews, retrieval 16 pairs per split, image 72/8/16."""
  write_aclimdb_tar(os.path.join(data_dir, 'text'))
  write_aan_tsv(os.path.join(data_dir, 'retrieval'))
  write_cifar_tar(os.path.join(data_dir, 'image'))
  return data_dir
