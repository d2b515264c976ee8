"""Readers of the released data (text, retrieval, image) on tiny fixtures in
the real formats: tokens, splits, agreement of sources, errors."""

import filecmp
import os
import pickle
import re
import struct

import numpy as np
import pytest
import release_fixtures as fx

from lra import data as tasks
from lra.data import cache, image, release, retrieval, text, tfrecord
from lra.errors import UserError


@pytest.fixture(autouse=True)
def _no_user_tfds(monkeypatch, tmp_path):
  fx.isolate_tfds(monkeypatch, tmp_path)


def _prepare(module, data_dir, options=None, name='cache'):
  options = options or {}
  cache_dir = os.path.join(data_dir, name, module.cache_name(options))
  module.prepare(cache_dir, str(data_dir), options, progress=False)
  return {s: cache.load_split(cache_dir, s) for s in cache.SPLITS}, cache_dir


def _rows(split):
  """A split's examples as a sorted list, to compare sources that differ
  only in order."""
  inputs, labels = split
  return sorted(zip(labels.tolist(), (r.tobytes() for r in inputs)))


def _assert_same(a, b):
  for s in cache.SPLITS:
    for x, y in zip(a[s], b[s]):
      np.testing.assert_array_equal(x, y)


# ------------------------------------------------------------- TFRecord ----


def test_crc32c_known_value_and_mask():
  assert tfrecord._crc32c_python(b'123456789') == 0xE3069283
  assert tfrecord.crc32c(b'123456789') == 0xE3069283
  crc = 0xE3069283
  masked = (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF
  assert tfrecord.masked_crc(b'123456789') == masked


def test_parse_example_all_encodings():
  unpacked = b'\x08' + fx._varint(5) + b'\x08' + fx._varint(-1)
  floats = fx._field(1, struct.pack('<2f', 0.5, -2.0))
  features = (
    fx._field(1, fx._field(1, b'n') + fx._field(2, fx._field(3, unpacked)))
    + fx._field(1, fx._field(1, b'f') + fx._field(2, fx._field(2, floats)))
    + fx._field(1, fx._field(1, b'e') + fx._field(2, b''))
  )
  parsed = tfrecord.parse_example(fx._field(1, features))
  assert parsed == {'n': [5, -1], 'f': [0.5, -2.0], 'e': []}
  parsed = tfrecord.parse_example(fx.example(text='é'.encode(), label=-3))
  assert parsed == {'text': ['é'.encode()], 'label': [-3]}


def test_tfrecord_roundtrip_and_corruption(tmp_path):
  path = str(tmp_path / 'x.tfrecord')
  records = [fx.example(label=i) for i in range(3)]
  fx.write_tfrecord(path, records)
  assert list(tfrecord.read_records(path)) == records
  good = open(path, 'rb').read()
  bad = bytearray(good)
  bad[len(bad) // 2] ^= 1  # inside record 1
  open(path, 'wb').write(bytes(bad))
  with pytest.raises(UserError, match='x.tfrecord: record 1 .*CRC'):
    list(tfrecord.read_records(path))
  open(path, 'wb').write(good[:-3])
  with pytest.raises(UserError, match='record 2 is truncated'):
    list(tfrecord.read_records(path))


def test_interleave_as_tf_data():
  """tf.data.Dataset.interleave's order, worked out by hand: cycle 2,
  block 3 over sources a (5 items), b (1), c (4), d (0), e (2)."""
  sources = ['a' * 5, 'b', 'c' * 4, '', 'e' * 2]
  got = ''.join(tfrecord.interleave(sources, 2, 3))
  # slot 0: a a a | slot 1: b (ends: freed) | slot 0: a a (ends) |
  # slot 1: c c c | slot 0: d (empty, ends) | slot 1: c (ends) |
  # slot 0: e e (ends) | slot 1: no source left.
  assert got == 'aaabaaccccee'
  assert list(tfrecord.interleave([], 16, 16)) == []


def test_tfds_order_slices_by_count_then_interleaves():
  # Shards of 20, 3 and 17 records; TFDS reads 16 at a time from up to 16.
  whole = tfrecord.tfds_order([20, 3, 17])
  expected = (
    [(0, i) for i in range(16)]
    + [(1, i) for i in range(3)]
    + [(2, i) for i in range(16)]
    + [(0, i) for i in range(16, 20)]
    + [(2, 16)]
  )
  assert whole == expected
  # train[:90%] of 40 = [0, 36): shard 2 is cut after 13 records; the
  # slice is taken over the shards in index order, before interleaving.
  assert tfrecord.tfds_boundary(90, 40) == 36
  head = tfrecord.tfds_order([20, 3, 17], 0, 36)
  assert head == (
    [(0, i) for i in range(16)]
    + [(1, i) for i in range(3)]
    + [(2, i) for i in range(13)]
    + [(0, i) for i in range(16, 20)]
  )
  assert tfrecord.tfds_order([20, 3, 17], 36) == [
    (2, i) for i in (13, 14, 15, 16)
  ]
  assert tfrecord.tfds_order([0, 2], 0, 1) == [(1, 0)]  # empty shard skipped
  # TFDS's 'closest' rounding (Python's round: halves to even).
  boundaries = [tfrecord.tfds_boundary(90, n) for n in (5, 15, 50_000)]
  assert boundaries == [4, 14, 45_000]


def test_tfds_files_needs_info_and_every_shard(tmp_path):
  root = fx.write_tfds_imdb(tmp_path / 'text', n_per_class=2)
  dataset_dir = os.path.dirname(root)
  files = tfrecord.tfds_files(dataset_dir, 'imdb_reviews', ('train', 'test'))
  assert [os.path.basename(p) for p in files['train']] == [
    'imdb_reviews-train.tfrecord-00000-of-00002',
    'imdb_reviews-train.tfrecord-00001-of-00002',
  ]
  # A newer version without dataset_info.json (not finished) is passed over.
  newer = os.path.join(dataset_dir, '1.0.10')
  os.makedirs(newer)
  for name in os.listdir(root):
    if name != 'dataset_info.json':
      os.link(os.path.join(root, name), os.path.join(newer, name))
  files = tfrecord.tfds_files(dataset_dir, 'imdb_reviews', ('train', 'test'))
  assert os.path.dirname(files['test'][0]) == root
  open(os.path.join(newer, 'dataset_info.json'), 'w').write('{}')
  files = tfrecord.tfds_files(dataset_dir, 'imdb_reviews', ('train', 'test'))
  assert os.path.dirname(files['test'][0]) == newer  # 1.0.10 > 1.0.0
  # A missing shard: that version is not prepared.
  os.remove(os.path.join(newer, 'imdb_reviews-train.tfrecord-00001-of-00002'))
  os.remove(os.path.join(root, 'imdb_reviews-train.tfrecord-00000-of-00002'))
  assert tfrecord.tfds_files(dataset_dir, 'imdb_reviews', ('train',)) is None


def test_tfds_data_dir_order(tmp_path, monkeypatch, caplog):
  data_dir = str(tmp_path / 'data')
  default = os.path.join(data_dir, 'text', 'tensorflow_datasets')
  home = release.home_tfds_dir()
  assert release.tfds_data_dir(data_dir, 'text')[0] == default
  # ~/tensorflow_datasets only when it holds the dataset.
  os.makedirs(os.path.join(home, 'imdb_reviews'))
  assert release.tfds_data_dir(data_dir, 'text')[0] == default
  fx.write_tfds_imdb(os.path.dirname(home), n_per_class=2)
  assert release.tfds_data_dir(data_dir, 'text')[0] == home
  assert release.tfds_data_dir(data_dir, 'image')[0] == os.path.join(
    data_dir, 'image', 'tensorflow_datasets'
  )
  # $TFDS_DATA_DIR when set, whatever it holds.
  env = str(tmp_path / 'env')
  monkeypatch.setenv('TFDS_DATA_DIR', env)
  assert release.tfds_data_dir(data_dir, 'text') == (env, 'from $TFDS_DATA_DIR')
  with pytest.raises(UserError) as e:
    _prepare(text, tmp_path / 'data', {'source': 'tfds'})
  msg = str(e.value)
  assert f'No prepared TFDS imdb_reviews in {env} (from $TFDS_DATA_DIR)' in msg
  assert '\n' not in msg and 'No IMDB source' not in msg
  # The readers look where the download would put it, and say so.
  monkeypatch.delenv('TFDS_DATA_DIR')
  with caplog.at_level('INFO', logger='lra.data.release'):
    splits, cache_dir = _prepare(text, tmp_path / 'data', {'source': 'tfds'})
  assert len(splits['train'][1]) == 4
  assert f'Reading TFDS IMDB from {home}' in caplog.text
  info = open(os.path.join(cache_dir, 'info.json')).read()
  assert os.path.join(home, 'imdb_reviews', 'plain_text', '1.0.0') in info


def test_tfds_reads_in_tfds_order(tmp_path):
  """Many shards: records come as TFDS's interleave gives them, and the
  image validation split is TFDS's train[90%:] (a count over the shards in
  index order, then interleaved), not the tail of the interleaved train."""
  lengths = [20, 3, 17, 0, 18] + [3] * 14  # 19 shards, 100 records
  folder = tmp_path / 'image' / 'tensorflow_datasets' / 'cifar10' / '3.0.2'
  os.makedirs(folder)
  (folder / 'dataset_info.json').write_text('{}')
  rng = np.random.default_rng(0)
  gray_of, offset = {}, 0
  for s, n in enumerate(lengths):
    records = []
    for i in range(n):
      level = (offset + i) % 251  # a uniform image tells its record
      records.append(
        fx.example(
          image=fx.png(np.full((32, 32, 3), level, np.uint8)),
          label=int(rng.integers(10)),
        )
      )
      gray_of[s, i] = level
    offset += n
    name = f'cifar10-train.tfrecord-{s:05d}-of-{len(lengths):05d}'
    fx.write_tfrecord(str(folder / name), records)
  test = [fx.example(image=fx.png(np.zeros((32, 32, 3), np.uint8)), label=1)]
  fx.write_tfrecord(str(folder / 'cifar10-test.tfrecord-00000-of-00001'), test)
  splits, _ = _prepare(image, tmp_path)
  for split, (start, stop) in (('train', (0, 90)), ('val', (90, None))):
    order = tfrecord.tfds_order(lengths, start, stop)
    levels = [gray_of[k] for k in order]
    assert splits[split][0][:, 0].tolist() == levels
  assert len(splits['val'][1]) == 10
  # The tail of the interleaved whole split would be other images.
  tail = [gray_of[k] for k in tfrecord.tfds_order(lengths)[90:]]
  assert splits['val'][0][:, 0].tolist() != tail


# ----------------------------------------------------------------- Text ----


def test_encode_bytes():
  x = text.encode_bytes([b'ab', 'é'.encode(), b'\xff', b'x' * 4100])
  assert x.dtype == np.int16 and x.shape == (4, 4000)
  np.testing.assert_array_equal(x[0, :3], [98, 99, 0])
  np.testing.assert_array_equal(x[1, :3], [0xC3 + 1, 0xA9 + 1, 0])
  assert x[2, 0] == 256 and not x[2, 1:].any()
  assert (x[3] == ord('x') + 1).all()


def test_text_archive(tmp_path):
  fx.write_aclimdb_tar(tmp_path / 'text', n_per_class=4)
  splits, cache_dir = _prepare(text, tmp_path)
  reviews = fx.imdb_reviews(4)
  for split in ('train', 'test'):
    inputs, labels = splits[split]
    assert inputs.dtype == np.int16 and inputs.shape == (8, 4000)
    assert labels.dtype == np.int32
    # File-name order: neg/0_*, ..., pos/3_*; pos = 1.
    expected = sorted(reviews[split])
    np.testing.assert_array_equal(labels, [r[0] == 'pos' for r in expected])
    for row, (_, _, raw) in zip(inputs, expected):
      body = raw.strip()[:4000]
      np.testing.assert_array_equal(
        row[: len(body)], np.frombuffer(body, 'u1') + 1
      )
      assert not row[len(body) :].any()
  # The > 4 KB review is cut, the padded one lost its whitespace.
  assert (splits['train'][0][0] > 0).all()
  assert splits['train'][0][1, 0] != ord(' ') + 1
  assert any(np.isin(splits['train'][0], [0xC3 + 1]).ravel())  # 'é', 'Ç'
  for x, y in zip(splits['val'], splits['test']):
    np.testing.assert_array_equal(x, y)
  assert (
    '"source": "archive"' in open(os.path.join(cache_dir, 'info.json')).read()
  )


def test_text_sources_agree(tmp_path):
  fx.write_aclimdb_tar(tmp_path / 'a' / 'text', n_per_class=3)
  fx.write_aclimdb_folders(tmp_path / 'b' / 'text', n_per_class=3)
  fx.write_tfds_imdb(tmp_path / 'c' / 'text', n_per_class=3)
  a, _ = _prepare(text, tmp_path / 'a')
  b, _ = _prepare(text, tmp_path / 'b')
  c, _ = _prepare(text, tmp_path / 'c', {'source': 'tfds'})
  _assert_same(a, b)
  for s in cache.SPLITS:
    assert _rows(a[s]) == _rows(c[s])
  assert len(a['train'][1]) == 6


def test_text_source_order_and_choice(tmp_path):
  fx.write_aclimdb_folders(tmp_path / 'text', n_per_class=2)
  fx.write_tfds_imdb(tmp_path / 'text', n_per_class=3)
  auto, _ = _prepare(text, tmp_path)  # folders come before TFDS
  assert len(auto['train'][1]) == 4
  tfds, _ = _prepare(text, tmp_path, {'source': 'tfds'})
  assert len(tfds['train'][1]) == 6
  assert text.cache_name({}) != text.cache_name({'source': 'tfds'})


def test_text_heldout_split(tmp_path):
  fx.write_aclimdb_tar(tmp_path / 'text', n_per_class=10)
  full, _ = _prepare(text, tmp_path)
  opts = {'val': 'heldout'}
  a, _ = _prepare(text, tmp_path, opts, name='one')
  b, _ = _prepare(text, tmp_path, opts, name='two')
  _assert_same(a, b)  # deterministic
  n = len(full['train'][1])
  num_val = round(n * text.HELDOUT_FRACTION)
  assert (len(a['train'][1]), len(a['val'][1])) == (n - num_val, num_val)
  joined = [np.concatenate([x, y]) for x, y in zip(a['train'], a['val'])]
  assert _rows(joined) == _rows(full['train'])  # disjoint, complete
  for x, y in zip(a['test'], full['test']):
    np.testing.assert_array_equal(x, y)


def test_text_errors(tmp_path):
  with pytest.raises(UserError) as e:
    _prepare(text, tmp_path)
  where = os.path.join(tmp_path, 'text', 'aclImdb_v1.tar.gz')
  assert 'download aclImdb_v1.tar.gz' in str(e.value)
  assert f'put it at {where}' in str(e.value)
  with pytest.raises(UserError) as e:
    _prepare(text, tmp_path, {'source': 'tfds'})
  assert str(e.value).startswith(
    'No prepared TFDS imdb_reviews in '
    f'{os.path.join(tmp_path, "text", "tensorflow_datasets")} (default: '
  )
  assert 'imdb_reviews/plain_text/<version>/ with dataset_info.json' in str(
    e.value
  )
  with pytest.raises(UserError, match="data.val 'dev'"):
    text.cache_name({'val': 'dev'})
  os.makedirs(tmp_path / 'text')
  with open(where, 'wb') as f:
    f.write(b'\x1f\x8b\x08\x00 not really gzip')
  with pytest.raises(UserError, match=f'Cannot read {re.escape(where)}'):
    _prepare(text, tmp_path)


def test_text_tfds_bad_label(tmp_path):
  root = fx.write_tfds_imdb(tmp_path / 'text', n_per_class=2)
  shard = os.path.join(root, 'imdb_reviews-test.tfrecord-00000-of-00001')
  fx.write_tfrecord(
    shard, [fx.example(text=b'ok', label=1), fx.example(text=b'x', label=2)]
  )
  with pytest.raises(UserError, match='test.tfrecord-00000-of-00001: record 1'):
    _prepare(text, tmp_path)
  fx.write_tfrecord(shard, [fx.example(text=b'no label')])
  with pytest.raises(UserError, match="record 0: feature 'label' is missing"):
    _prepare(text, tmp_path)


# ------------------------------------------------------------ Retrieval ----


def test_retrieval_tsv(tmp_path):
  fx.write_aan_tsv(tmp_path / 'retrieval', n=6)
  splits, _ = _prepare(retrieval, tmp_path)
  for split, seed in (('train', 0), ('val', 1), ('test', 2)):
    inputs, labels = splits[split]
    rows = fx.aan_rows(6, seed)
    assert inputs.dtype == np.int16 and inputs.shape == (6, 2, 4000)
    np.testing.assert_array_equal(labels, [int(r[0]) for r in rows])
    for x, row in zip(inputs, rows):
      for j, doc in enumerate(row[3:]):
        doc = doc[:4000]
        np.testing.assert_array_equal(
          x[j, : len(doc)], np.frombuffer(doc, 'u1') + 1
        )
        assert not x[j, len(doc) :].any()
  assert (splits['train'][0][0, 0] > 0).all()  # a > 4 KB text, cut
  assert (splits['train'][0][3, 1] > 0).all()


def test_retrieval_tsv_data_folder_float_labels_crlf(tmp_path):
  folder = fx.write_aan_tsv(tmp_path / 'retrieval', n=4, in_tsv_data=True)
  path = os.path.join(folder, 'new_aan_pairs.test.tsv')
  lines = open(path, 'rb').read().splitlines()
  fixed = [(b'1.0' if ln[0:1] == b'1' else b'0.0') + ln[1:] for ln in lines]
  open(path, 'wb').write(b'\r\n'.join(fixed) + b'\r\n\n')  # + a blank line
  splits, _ = _prepare(retrieval, tmp_path)
  np.testing.assert_array_equal(splits['test'][1], [0, 1, 0, 1])
  expected = fx.aan_rows(4, 2)[3][4][:4000]
  got = splits['test'][0][3, 1, : len(expected)]
  np.testing.assert_array_equal(got, np.frombuffer(expected, 'u1') + 1)


@pytest.mark.parametrize(
  'line, message',
  [
    (b'1\tid1\tid2\tonly four', 'expected 5 tab-separated fields'),
    (b'1\ta\tb\tc\td\te', 'expected 5 .*found 6'),
    (b'yes\ta\tb\tc\td', "label 'yes' is not 0 or 1"),
    (b'2\ta\tb\tc\td', "label '2' is not 0 or 1"),
    (b'\ta\tb\tc\td', "label '' is not 0 or 1"),
  ],
)
def test_retrieval_malformed_row(tmp_path, line, message):
  folder = fx.write_aan_tsv(tmp_path / 'retrieval', n=5)
  path = os.path.join(folder, 'new_aan_pairs.eval.tsv')
  lines = open(path, 'rb').read().splitlines()
  lines[2] = line
  open(path, 'wb').write(b'\n'.join(lines) + b'\n')
  with pytest.raises(UserError, match=f'new_aan_pairs.eval.tsv:3: {message}'):
    _prepare(retrieval, tmp_path)


def test_retrieval_missing(tmp_path):
  with pytest.raises(UserError) as e:
    _prepare(retrieval, tmp_path)
  assert 'lra_release.gz' in str(e.value)
  assert os.path.join(tmp_path, 'retrieval') + '/' in str(e.value)
  folder = fx.write_aan_tsv(tmp_path / 'retrieval', n=2)
  os.remove(os.path.join(folder, 'new_aan_pairs.eval.tsv'))
  missing = os.path.join(folder, 'new_aan_pairs.eval.tsv')
  with pytest.raises(UserError, match=f'Missing {re.escape(missing)}'):
    _prepare(retrieval, tmp_path)


# ---------------------------------------------------------------- Image ----


def test_grayscale_formula():
  pixels = [[255] * 3, [255, 0, 0], [0, 255, 0], [0, 0, 255], [10, 20, 30]]
  pixels = np.array(pixels + [[0, 0, 0]], np.uint8)
  exact = np.floor(pixels @ np.array(image.WEIGHTS) * 255.5 / 255)
  np.testing.assert_array_equal(image.grayscale(pixels), exact)
  np.testing.assert_array_equal(exact, [255, 76, 149, 29, 18, 0])
  every = np.stack(np.meshgrid(*[np.arange(0, 256, 15)] * 3), -1)
  every = every.reshape(-1, 3).astype(np.uint8)
  gray = image.grayscale(every).astype(np.float64)
  ref = every @ np.array(image.WEIGHTS) * 255.5 / 255
  assert (np.abs(gray - np.floor(ref)) <= 1).all()
  assert (gray <= ref + 1e-4).all()  # truncation, never rounding up


def test_image_archive(tmp_path):
  fx.write_cifar_tar(tmp_path / 'image', n_per_batch=10)
  splits, _ = _prepare(image, tmp_path)
  train_rgb, train_labels, test_rgb, test_labels = fx.cifar_images(10)
  num_val = len(train_labels) - round(0.9 * len(train_labels))
  assert num_val == 5
  gray = image.grayscale(train_rgb.reshape(-1, 1024, 3))
  expected = {
    'train': (gray[:-num_val], train_labels[:-num_val]),
    'val': (gray[-num_val:], train_labels[-num_val:]),
    'test': (image.grayscale(test_rgb.reshape(-1, 1024, 3)), test_labels),
  }
  for s in cache.SPLITS:
    inputs, labels = splits[s]
    assert inputs.dtype == np.uint8 and inputs.shape[1:] == (1024,)
    np.testing.assert_array_equal(inputs, expected[s][0])
    np.testing.assert_array_equal(labels, expected[s][1])
  assert (len(splits['train'][1]), len(splits['val'][1])) == (45, 5)
  inputs = splits['train'][0]
  assert not inputs[0].any()  # the black image stays black
  np.testing.assert_array_equal(inputs[1, :6], [255, 76, 149, 29, 18, 0])
  assert (inputs == 0).sum() > 16 * 45  # black patches kept as 0
  assert tasks.get_task('image').pad_id is None  # 0 is never padding


def test_image_sources_agree_and_deterministic(tmp_path):
  fx.write_cifar_tar(tmp_path / 'a' / 'image', n_per_batch=4)
  fx.write_cifar_folders(tmp_path / 'b' / 'image', n_per_batch=4)
  fx.write_tfds_cifar(tmp_path / 'c' / 'image', n_per_batch=4)
  a, dir_a = _prepare(image, tmp_path / 'a')
  b, _ = _prepare(image, tmp_path / 'b')
  c, _ = _prepare(image, tmp_path / 'c')
  _assert_same(a, b)
  _assert_same(a, c)
  assert (len(a['train'][1]), len(a['val'][1])) == (18, 2)
  _, dir_a2 = _prepare(image, tmp_path / 'a', name='again')
  names = [f'{s}_{k}.npy' for s in cache.SPLITS for k in ('inputs', 'labels')]
  match, _, _ = filecmp.cmpfiles(dir_a, dir_a2, names, shallow=False)
  assert match == names


def _rewrite_batch(folder, name, changes):
  path = os.path.join(folder, name)
  batch = pickle.load(open(path, 'rb'), encoding='bytes')
  batch.update(changes)
  pickle.dump(batch, open(path, 'wb'), protocol=2)
  return path


def test_image_bad_batches(tmp_path):
  folder = fx.write_cifar_folders(tmp_path / 'image', n_per_batch=3)
  path = _rewrite_batch(
    folder, 'data_batch_3', {b'data': np.zeros((3, 3000), np.uint8)}
  )
  message = re.escape(f"{path}: b'data' is (3, 3000)")
  with pytest.raises(UserError, match=message):
    _prepare(image, tmp_path)
  folder = fx.write_cifar_folders(tmp_path / 'image', n_per_batch=3)
  path = _rewrite_batch(folder, 'test_batch', {b'labels': [1, 10, 2]})
  with pytest.raises(UserError, match=re.escape(f'{path}: label 1 is 10')):
    _prepare(image, tmp_path)
  _rewrite_batch(folder, 'test_batch', {b'labels': [1, 2]})
  with pytest.raises(UserError, match='2 labels for 3 images'):
    _prepare(image, tmp_path)
  with open(os.path.join(folder, 'test_batch'), 'wb') as f:
    pickle.dump(os.system, f, protocol=2)  # a pickle that could run code
  with pytest.raises(UserError, match='not a CIFAR-10 python batch'):
    _prepare(image, tmp_path)


def test_image_tfds_bad_image(tmp_path):
  root = fx.write_tfds_cifar(tmp_path / 'image', n_per_batch=2)
  good = fx.png(np.zeros((32, 32, 3), np.uint8))
  small = fx.png(np.zeros((28, 28, 3), np.uint8))
  shard = os.path.join(root, 'cifar10-test.tfrecord-00000-of-00001')
  records = [fx.example(image=good, label=1)] * 2
  fx.write_tfrecord(shard, records + [fx.example(image=small, label=1)])
  with pytest.raises(UserError, match='record 2: image is 28x28 RGB'):
    _prepare(image, tmp_path)
  fx.write_tfrecord(shard, records + [fx.example(image=b'junk', label=1)])
  with pytest.raises(UserError, match='record 2: cannot decode'):
    _prepare(image, tmp_path)
  fx.write_tfrecord(shard, [fx.example(image=good, label=12)])
  with pytest.raises(UserError, match='record 0 has label 12'):
    _prepare(image, tmp_path)


def test_image_missing(tmp_path):
  with pytest.raises(UserError) as e:
    _prepare(image, tmp_path)
  where = os.path.join(tmp_path, 'image', 'cifar-10-python.tar.gz')
  assert 'download cifar-10-python.tar.gz' in str(e.value)
  assert f'put it at {where}' in str(e.value)
  fx.write_cifar_folders(tmp_path / 'image', n_per_batch=2)
  os.remove(
    os.path.join(tmp_path, 'image', 'cifar-10-batches-py', 'test_batch')
  )
  with pytest.raises(UserError, match='Cannot read .*test_batch'):
    _prepare(image, tmp_path)


def test_release_data_prepares_every_task(tmp_path):
  fx.write_release_data(tmp_path)
  for name in ('text', 'retrieval', 'image'):
    task = tasks.get_task(name)
    path = task.ensure_prepared(str(tmp_path), {}, progress=False)
    inputs, labels = cache.load_split(path, 'val')
    assert len(labels) >= 8  # a whole smoke eval batch
    assert inputs.max() < task.vocab_size
    assert labels.max() < task.num_classes
