"""Byte-level IMDB (LRA Text): is a movie review positive or negative?

25,000 train and 25,000 test reviews (Maas et al., 2011). Tokens are the
review's UTF-8 bytes + 1 (0 = padding, vocab 257); the cache keeps the first
4,000 bytes (the paper's longest setting) and the config's `max_length` cuts
what the model sees. Labels: neg = 0, pos = 1. Text is stripped of leading
and trailing ASCII whitespace, as TFDS `imdb_reviews` does, so every source
gives the same tokens.

Sources, looked for in this order:
  archive  <data_dir>/text/aclImdb_v1.tar.gz, read member by member (no
           extraction);
  folders  <data_dir>/text/aclImdb/{train,test}/{pos,neg}/*.txt (the
           archive unpacked);
  tfds     <TFDS data dir>/imdb_reviews/plain_text/<version>/ (TFDS
           prepared files, read without TensorFlow; the TFDS data dir is
           $TFDS_DATA_DIR, else ~/tensorflow_datasets when it holds them,
           else <data_dir>/text/tensorflow_datasets: lra/data/release.py).
Archive and folders are read in file-name order; TFDS in the order of
tfds.load(split, shuffle_files=False).

Validation: LRA had none and validated on the test set; `val='test'` does
the same. `val='heldout'` holds out the last 10% of a seeded shuffle of the
train set instead (train keeps 90%).
"""

import os
import re
import tarfile
import zlib

import numpy as np
import tqdm

from lra.data import cache, release, tfrecord
from lra.errors import UserError

WIDTH = 4000  # cache width in bytes
HELDOUT_FRACTION = 0.1
HELDOUT_SEED = 0
ARCHIVE = 'aclImdb_v1.tar.gz'
URL = 'https://ai.stanford.edu/~amaas/data/sentiment/'
_LABELS = {'neg': 0, 'pos': 1}
_MEMBER = re.compile(r'(?:\./)?aclImdb/(train|test)/(pos|neg)/([^/]+\.txt)')


def _options(options):
  val = options.get('val', 'test')
  source = options.get('source', 'auto')
  if val not in ('test', 'heldout'):
    raise UserError(f"Unknown data.val {val!r}; use 'test' or 'heldout'.")
  return val, release.check_source(source)


def cache_name(options):
  val, source = _options(options)
  return f'val_{val}' + ('' if source == 'auto' else f'_{source}')


def encode_bytes(texts, width=WIDTH):
  """Byte strings -> int16 [N, width]: byte + 1, cut to width, 0-padded."""
  out = np.zeros((len(texts), width), np.int16)
  for i, text in enumerate(texts):
    row = np.frombuffer(text[:width], np.uint8)
    out[i, : len(row)] = row.astype(np.int16) + 1
  return out


def _source_paths(data_dir):
  root = os.path.join(data_dir, 'text')
  return {
    'archive': os.path.join(root, ARCHIVE),
    'folders': os.path.join(root, 'aclImdb'),
  }


def _read_archive(path, progress):
  found = {'train': [], 'test': []}
  try:
    with tarfile.open(path, 'r:*') as tar:
      for member in tqdm.tqdm(
        tar, desc=f'reading {ARCHIVE}', unit=' files', disable=not progress
      ):
        match = _MEMBER.fullmatch(member.name)
        if match and member.isfile():
          split, label, name = match.groups()
          text = tar.extractfile(member).read().strip()
          found[split].append((f'{label}/{name}', _LABELS[label], text))
  except (tarfile.TarError, OSError, EOFError, zlib.error) as e:
    raise UserError(
      f'Cannot read {path} ({e}); download {ARCHIVE} from {URL} again.'
    ) from None
  for split, rows in found.items():
    if not rows:
      raise UserError(
        f'{path} has no aclImdb/{split}/{{pos,neg}}/*.txt reviews; '
        f'download {ARCHIVE} from {URL} again.'
      )
  return {split: sorted(rows) for split, rows in found.items()}


def _read_folders(root, progress):
  found = {}
  for split in ('train', 'test'):
    rows = []
    for label, y in _LABELS.items():
      folder = os.path.join(root, split, label)
      if not os.path.isdir(folder):
        raise UserError(
          f'Missing folder {folder}; unpack {ARCHIVE} from {URL} again.'
        )
      names = sorted(n for n in os.listdir(folder) if n.endswith('.txt'))
      for name in tqdm.tqdm(
        names, desc=f'reading {split}/{label}', disable=not progress
      ):
        path = os.path.join(folder, name)
        try:
          with open(path, 'rb') as f:
            rows.append((f'{label}/{name}', y, f.read().strip()))
        except OSError as e:
          raise UserError(f'Cannot read {path} ({e}).') from None
    found[split] = rows
  return found


def _read_tfds(files, progress):
  """{split: rows} in the order tfds.load(split, shuffle_files=False)
  gives them (tfrecord.tfds_order)."""
  found = {}
  for split, paths in files.items():
    shards = []
    for path in paths:
      rows = []
      for i, features in tqdm.tqdm(
        tfrecord.read_examples(path),
        desc=f'reading {os.path.basename(path)}',
        disable=not progress,
      ):
        text = tfrecord.feature(features, 'text', path, i)
        label = tfrecord.feature(features, 'label', path, i)
        if not isinstance(label, int) or label not in (0, 1):
          raise UserError(
            f'{path}: record {i} has label {label!r}, expected 0 or 1; '
            'is this imdb_reviews/plain_text?'
          )
        if not isinstance(text, bytes):
          raise UserError(
            f'{path}: record {i}: feature text is not a byte string; '
            'is this imdb_reviews/plain_text?'
          )
        rows.append((f'{os.path.basename(path)}:{i}', label, text))
      shards.append(rows)
    order = tfrecord.tfds_order([len(rows) for rows in shards])
    found[split] = [shards[s][i] for s, i in order]
  return found


def _find_source(data_dir, source, progress):
  """Returns (source name, its path, {split: [(key, label, text)]})."""
  return release.find(
    source,
    _source_paths(data_dir),
    {
      'archive': lambda path: _read_archive(path, progress),
      'folders': lambda path: _read_folders(path, progress),
      'tfds': lambda files: _read_tfds(files, progress),
    },
    task='text',
    data_dir=data_dir,
    dataset='IMDB',
    archive=ARCHIVE,
    url=URL,
  )


def prepare(cache_dir, data_dir, options, progress=True):
  """Converts IMDB into the cache: train, val and test splits."""
  val, source = _options(options)
  source, path, found = _find_source(data_dir, source, progress)
  splits = {}
  for split, rows in found.items():
    labels = np.array([y for _, y, _ in rows], np.int32)
    splits[split] = (encode_bytes([t for _, _, t in rows]), labels)
  if val == 'test':
    splits['val'] = splits['test']
  else:
    inputs, labels = splits['train']
    n = len(labels)
    num_val = int(round(n * HELDOUT_FRACTION))
    order = np.random.default_rng(HELDOUT_SEED).permutation(n)
    train, held = np.sort(order[: n - num_val]), np.sort(order[n - num_val :])
    splits['train'] = inputs[train], labels[train]
    splits['val'] = inputs[held], labels[held]
  os.makedirs(cache_dir, exist_ok=True)
  cache.write_info(
    cache_dir,
    task='text',
    source=source,
    source_path=path,
    val=val,
    width=WIDTH,
    tokens='UTF-8 byte + 1; 0 = padding',
    sizes={s: len(splits[s][1]) for s in cache.SPLITS},
    reviews_cut={
      s: int(sum(len(t) > WIDTH for _, _, t in rows))
      for s, rows in found.items()
    },
  )
  for split in cache.SPLITS:
    cache.save_split(cache_dir, split, *splits[split])
