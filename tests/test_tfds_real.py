"""Our TFDS reader against TensorFlow Datasets itself (skipped, with the
reason, where tensorflow-datasets and tensorflow are not installed:
pip install -e '.[tfds]').

The fixtures are written by TFDS's own imdb_reviews and cifar10 builders
(the registered ones: their names, versions, features and writer), offline:
their download step is handed the tiny release-format archives of
release_fixtures.py instead of the real files, and they write 18 shards a
split, so that TFDS's interleaved reading order matters. Then for every
split the LRA reads, our reader (no TensorFlow) must give the records of
tfds.load(name, split=..., shuffle_files=False) in the same order.
"""

import os
import random
import warnings

import numpy as np
import pytest
import release_fixtures as fx

from lra.data import cache, image, prepare, release, text, tfrecord

with warnings.catch_warnings():
  warnings.simplefilter('ignore', DeprecationWarning)
  tfds = pytest.importorskip(
    'tensorflow_datasets',
    reason="needs TensorFlow Datasets: pip install -e '.[tfds]'",
  )
  tf = pytest.importorskip(
    'tensorflow', reason="needs TensorFlow: pip install -e '.[tfds]'"
  )


pytestmark = pytest.mark.filterwarnings('ignore::DeprecationWarning')
NUM_SHARDS = 18  # more than TFDS's interleave cycle (16)


def _cifar_binary(folder, n_per_batch):
  """`<folder>/cifar-10-batches-bin/`, the binary release TFDS's cifar10
  reads: per image a label byte, then the R, G and B planes."""
  train, train_labels, test, test_labels = fx.cifar_images(n_per_batch)
  root = os.path.join(folder, 'cifar-10-batches-bin')
  os.makedirs(root)

  def write(name, rgb, labels):
    with open(os.path.join(root, name), 'wb') as f:
      for x, y in zip(rgb, labels):
        f.write(bytes([int(y)]) + x.transpose(2, 0, 1).tobytes())

  for b in range(5):
    rows = slice(b * n_per_batch, (b + 1) * n_per_batch)
    write(f'data_batch_{b + 1}.bin', train[rows], train_labels[rows])
  write('test_batch.bin', test, test_labels)
  with open(os.path.join(root, 'batches.meta.txt'), 'w') as f:
    f.write('\n'.join(f'class_{i}' for i in range(10)) + '\n')
  return folder


def _aclimdb_tar(folder, n_per_class):
  """fx.write_aclimdb_tar's archive with enough unlabelled reviews for TFDS
  to write its `unsupervised` split in NUM_SHARDS shards."""
  files = fx._imdb_files(n_per_class)
  for i in range(NUM_SHARDS):
    files[f'aclImdb/train/unsup/{i + 1}_0.txt'] = b'Unlabelled %d.' % i
  path = os.path.join(folder, 'aclImdb_v1.tar.gz')
  return fx._write_tar(path, files, dirs=['aclImdb/'])


def _prepare_with_tfds(builder, root, monkeypatch, **downloaded):
  """TFDS's registered `builder` prepares into `root`, its download calls
  answered from `downloaded` ({method name: local path}): no network."""
  for method, path in downloaded.items():
    monkeypatch.setattr(
      tfds.download.DownloadManager, method, lambda self, url, p=path: p
    )
  config = tfds.download.DownloadConfig(
    num_shards=NUM_SHARDS, try_download_gcs=False
  )
  tfds.builder(builder, data_dir=root).download_and_prepare(
    download_config=config
  )


@pytest.fixture(scope='module')
def tfds_root(tmp_path_factory):
  """A TFDS data directory holding imdb_reviews and cifar10 as TFDS's own
  builders write them."""
  root = str(tmp_path_factory.mktemp('tfds') / 'tensorflow_datasets')
  scratch = tmp_path_factory.mktemp('release')
  with pytest.MonkeyPatch.context() as m:
    archive = _aclimdb_tar(str(scratch), n_per_class=180)
    _prepare_with_tfds('imdb_reviews/plain_text', root, m, download=archive)
    binary = _cifar_binary(str(scratch), n_per_batch=72)
    _prepare_with_tfds('cifar10', root, m, download_and_extract=binary)
  return root


def _load(name, split, root):
  ds = tfds.load(
    name, split=split, data_dir=root, shuffle_files=False, download=False
  )
  return list(ds.as_numpy_iterator())


def test_tf_data_interleave_order():
  """tfrecord.interleave against tf.data.Dataset.interleave as TFDS calls
  it (parallel, deterministic), on random source lengths."""
  rng = random.Random(0)
  for _ in range(20):
    lengths = [
      rng.choice([0, 1, 5, 16, 17, 40]) for _ in range(rng.randint(1, 40))
    ]
    cycle, block = rng.choice([(16, 16), (3, 2), (1, 16)])
    starts = np.cumsum([0] + lengths)[:-1]
    ds = tf.data.Dataset.from_tensor_slices(
      (tf.constant(starts, tf.int64), tf.constant(lengths, tf.int64))
    ).interleave(
      lambda s, n: tf.data.Dataset.range(s, s + n),
      cycle_length=cycle,
      block_length=block,
      num_parallel_calls=tf.data.AUTOTUNE,
      deterministic=True,
    )
    sources = [range(s, s + n) for s, n in zip(starts, lengths)]
    ours = list(tfrecord.interleave(sources, cycle, block))
    assert [int(x) for x in ds.as_numpy_iterator()] == ours


def test_text_records_as_tfds_load(tfds_root):
  files = release.tfds_prepared(tfds_root, 'text')
  assert len(files['train']) == NUM_SHARDS
  ours = text._read_tfds(files, progress=False)
  for split in ('train', 'test'):
    want = [
      (int(r['label']), r['text'])
      for r in _load('imdb_reviews', split, tfds_root)
    ]
    assert len(want) == 360
    assert [(y, t) for _, y, t in ours[split]] == want
  # Not merely the shards one after another: the order is TFDS's.
  flat = [
    tfrecord.parse_example(r)['text'][0]
    for path in files['train']
    for r in tfrecord.read_records(path)
  ]
  assert flat != [t for _, _, t in ours['train']]
  assert sorted(flat) == sorted(t for _, _, t in ours['train'])


def test_image_splits_as_tfds_load(tfds_root):
  files = release.tfds_prepared(tfds_root, 'image')
  assert len(files['train']) == NUM_SHARDS
  ours = image._read_tfds(files, progress=False)
  for split, tfds_split in (
    ('train', 'train[:90%]'),
    ('val', 'train[90%:]'),
    ('test', 'test'),
  ):
    want = _load('cifar10', tfds_split, tfds_root)
    gray = image.grayscale(np.stack([r['image'] for r in want]))
    np.testing.assert_array_equal(ours[split][0], gray.reshape(len(want), -1))
    np.testing.assert_array_equal(ours[split][1], [r['label'] for r in want])
  assert (len(ours['train'][1]), len(ours['val'][1])) == (324, 36)
  # train[90%:] is not the tail of the interleaved train split.
  whole = _load('cifar10', 'train', tfds_root)
  tail = image.grayscale(np.stack([r['image'] for r in whole[324:]]))
  assert not np.array_equal(ours['val'][0], tail.reshape(36, -1))


def test_prepare_reads_tfds_data_dir_without_download(
  tfds_root, tmp_path, monkeypatch, capsys
):
  """`prepare text|image --download --source tfds`, $TFDS_DATA_DIR holding
  the dataset: read in place; TFDS is asked for nothing."""
  fx.isolate_tfds(monkeypatch, tmp_path)
  monkeypatch.setenv('TFDS_DATA_DIR', tfds_root)

  def refuse(*args, **kwargs):
    raise AssertionError('TFDS was asked to download or prepare')

  monkeypatch.setattr(tfds.core.DatasetBuilder, 'download_and_prepare', refuse)
  monkeypatch.setattr(tfds.download.DownloadManager, 'download', refuse)
  d = str(tmp_path / 'data')
  for task, name in (('text', 'imdb_reviews'), ('image', 'cifar10')):
    args = [task, '--data_dir', d, '--download', '--source', 'tfds']
    assert prepare.main(args) == 0
    out = capsys.readouterr().out
    assert (
      f'TFDS {name} already prepared in {tfds_root} (from $TFDS_DATA_DIR)'
      in out
    )
    assert f'from tfds {tfds_root}/{name}/' in out
  path = os.path.join(d, 'text', 'val_test')
  inputs, labels = cache.load_split(path, 'train')
  want = _load('imdb_reviews', 'train', tfds_root)
  np.testing.assert_array_equal(labels, [r['label'] for r in want])
  np.testing.assert_array_equal(
    inputs, text.encode_bytes([r['text'] for r in want])
  )
  inputs, labels = cache.load_split(os.path.join(d, 'image', 'gray'), 'val')
  want = _load('cifar10', 'train[90%:]', tfds_root)
  np.testing.assert_array_equal(labels, [r['label'] for r in want])
  assert not os.path.exists(os.path.join(d, 'text', 'tensorflow_datasets'))


def test_the_builders_read_the_fixture_archives(tfds_root):
  """TFDS's builders read our release-format archives: every review and
  image is in their splits (stripped text, as TFDS writes it)."""
  reviews = fx.imdb_reviews(180)['test']
  got = sorted(r['text'] for r in _load('imdb_reviews', 'test', tfds_root))
  assert got == sorted(t.strip() for _, _, t in reviews)
  _, _, test, labels = fx.cifar_images(72)
  got = {r['id']: r for r in _load('cifar10', 'test', tfds_root)}
  for i in (0, 71):
    np.testing.assert_array_equal(
      got[f'test_{i:05d}'.encode()]['image'], test[i]
    )
    assert got[f'test_{i:05d}'.encode()]['label'] == labels[i]
