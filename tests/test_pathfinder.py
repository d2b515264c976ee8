"""Pathfinder / Path-X: the generator, the release reader and the cache."""

import os

import numpy as np
from PIL import Image
import pytest

from lra import cache, pathfinder, tasks
from lra import pathfinder_gen as gen
from lra.errors import UserError

HARD = gen.CONTOUR_LENGTHS['hard']


def _chunk(labels, res=32, length=HARD, seed=0, index=0):
  return gen.generate_chunk(np.asarray(labels), res, length, seed, index)


def test_generator_is_deterministic_and_seeded():
  labels = np.arange(16) % 2
  a, b = _chunk(labels), _chunk(labels)
  np.testing.assert_array_equal(a, b)
  assert not np.array_equal(a, _chunk(labels, seed=1))
  assert not np.array_equal(a, _chunk(labels, index=1))


@pytest.mark.parametrize('res', [32, 128])
def test_images_are_uint8_with_dark_background_and_bright_ink(res):
  images = _chunk(np.arange(4) % 2, res=res)
  assert images.dtype == np.uint8 and images.shape == (4, res * res)
  for img in images:
    assert np.mean(img == 0) > 0.5  # mostly background
    assert img.max() == 255  # full-brightness markers
    ink = np.mean(img > 128)
    assert 0.02 < ink < 0.5


def test_labels_change_only_the_far_marker():
  """Same seed: the same snakes; label 1 puts the second marker on the end
  of the first marker's snake, label 0 on the end of the other snake."""
  n = 32
  pos, neg = _chunk(np.ones(n)), _chunk(np.zeros(n))
  geom = gen.chunk_geometry(n, 32, HARD, seed=0, index=0)
  p = gen.RESOLUTIONS[32]
  yy, xx = np.mgrid[:32, :32]
  for i in range(n):
    o = geom['origin'][i]
    near = p.marker_radius + 1.5
    ends = {
      'tail': geom['tails'][i, o],
      'own': geom['heads'][i, o],
      'other': geom['heads'][i, 1 - o],
    }
    disc = {
      k: (xx - x) ** 2 + (yy - y) ** 2 <= near**2 for k, (x, y) in ends.items()
    }
    a, b = pos[i].reshape(32, 32), neg[i].reshape(32, 32)
    differ = a != b
    # Nothing differs away from the two candidate far ends.
    assert not differ[~(disc['own'] | disc['other'])].any()
    # Both markers show: the far marker is bright where it sits...
    assert a[disc['own']].max() == 255 and b[disc['other']].max() == 255
    # ...and the image without it there is clearly darker.
    core = {
      k: (xx - x) ** 2 + (yy - y) ** 2 <= p.marker_radius**2
      for k, (x, y) in ends.items()
    }
    assert a[core['own']].sum() > b[core['own']].sum() + 2 * 255
    assert b[core['other']].sum() > a[core['other']].sum() + 2 * 255
    # The origin marker is common to both.
    assert a[disc['tail']].max() == 255 == b[disc['tail']].max()


def test_markers_do_not_touch_the_other_target():
  geom = gen.grow(np.random.default_rng(3), 64, 32, HARD, 4096)
  p = gen.RESOLUTIONS[32]
  segs = geom['segs'][:, : 2 * HARD]
  for s in range(2):
    other = segs[:, 1 - s :: 2]
    for ends in (geom['tails'], geom['heads']):
      d = gen._segment_distance(
        ends[:, s, None], other[..., :2], other[..., 2:]
      )
      assert d.min() >= p.marker_radius + min(p.margins)


def test_splits_have_balanced_labels():
  sizes = pathfinder.split_sizes(200_000)
  assert sizes == (160_000, 20_000, 20_000)
  for n in sizes:
    y = pathfinder.balanced_labels(n, np.random.default_rng(0))
    assert y.sum() * 2 == n and y.dtype == np.int32
    assert 0.3 < y[: n // 2].mean() < 0.7  # shuffled, not sorted


def test_worker_count_does_not_change_images():
  labels = np.arange(2 * gen.CHUNK + 8) % 2
  one = list(pathfinder.generate(labels, 32, 'easy', 5, workers=0))
  assert [o for o, _ in one] == [0, gen.CHUNK, 2 * gen.CHUNK]
  two = list(pathfinder.generate(labels, 32, 'easy', 5, workers=2))
  assert [o for o, _ in two] == [o for o, _ in one]
  for (_, x), (_, y) in zip(one, two):
    np.testing.assert_array_equal(x, y)


def test_cache_round_trip_through_the_task_registry(tmp_path):
  options = dict(
    resolution=32, difficulty='easy', num_examples=320, source='auto', seed=0
  )
  task = tasks.get_task('pathfinder')
  path = task.ensure_prepared(str(tmp_path), options, progress=False)
  assert path.endswith(os.path.join('pathfinder', '32_easy_n320'))
  sizes = {}
  for split in cache.SPLITS:
    x, y = cache.load_split(path, split)
    assert x.dtype == np.uint8 and x.shape[1] == 1024
    assert y.dtype == np.int32 and 2 * y.sum() == len(y)
    sizes[split] = len(y)
  assert sizes == dict(train=256, val=32, test=32)
  # Same options, same seed: the same images, rebuilt from scratch.
  other = tasks.get_task('pathx').ensure_prepared(
    str(tmp_path), options, progress=False
  )
  for split in cache.SPLITS:
    np.testing.assert_array_equal(
      cache.load_split(path, split)[0], cache.load_split(other, split)[0]
    )


def test_bad_options_are_user_errors():
  with pytest.raises(UserError, match='resolution'):
    pathfinder.cache_name(dict(resolution=48))
  with pytest.raises(UserError, match='difficulty'):
    pathfinder.cache_name(dict(difficulty='extreme'))
  with pytest.raises(UserError, match='resolutoin'):
    pathfinder.cache_name(dict(resolutoin=32))
  assert pathfinder.cache_name({}) == '32_hard'
  assert pathfinder.cache_name(dict(source='release')) == '32_hard_release'
  assert pathfinder.cache_name(dict(variant='small')) == '32_easy_n20000'


# ---------------------------------------------------------------- release


def _write_release(data_dir, task='pathfinder', res=32, n=40, bad=None):
  """The release layout: imgs/<k>/sample_<i>.png + metadata/<k>.npy text."""
  root = os.path.join(
    data_dir, task, 'release', f'pathfinder{res}', 'curv_contour_length_14'
  )
  images = _chunk(np.arange(n) % 2, res=res)
  lines = {0: [], 1: []}
  for i in range(n):
    k = i % 2
    folder = os.path.join(root, 'imgs', str(k))
    os.makedirs(folder, exist_ok=True)
    name = f'sample_{i}.png'
    Image.fromarray(images[i].reshape(res, res)).save(
      os.path.join(folder, name)
    )
    label = i % 2
    lines[k].append(f'imgs/{k} {name} {i} {label} 1.0 14 4 2 0.5 1 1')
  os.makedirs(os.path.join(root, 'metadata'))
  for k, rows in lines.items():
    if bad is not None and k == 1:
      rows[2] = rows[2].replace(' 1 1.0 ', f' {bad} 1.0 ')
    with open(os.path.join(root, 'metadata', f'{k}.npy'), 'w') as f:
      f.write('\n'.join(rows) + '\n')
  return root, images


def test_release_reader_converts_and_skips_unreadable(tmp_path, capsys):
  root, images = _write_release(str(tmp_path))
  # sample_3 is empty, sample_5 is not a PNG: both skipped and counted.
  open(os.path.join(root, 'imgs', '1', 'sample_3.png'), 'wb').close()
  with open(os.path.join(root, 'imgs', '1', 'sample_5.png'), 'wb') as f:
    f.write(b'not a png')
  options = dict(resolution=32, difficulty='hard', source='auto')
  path = tasks.get_task('pathfinder').ensure_prepared(
    str(tmp_path), options, progress=False
  )
  assert 'skipped 2 unreadable images' in capsys.readouterr().out
  index = {img.tobytes(): i for i, img in enumerate(images)}
  seen = []
  for split in cache.SPLITS:
    x, y = cache.load_split(path, split)
    for img, label in zip(x, y):
      i = index[img.tobytes()]
      assert label == i % 2  # the fixture's label travels with its image
      seen.append(i)
  assert sorted(seen) == [i for i in range(40) if i not in (3, 5)]


def test_release_bad_label_names_file_and_line(tmp_path):
  _write_release(str(tmp_path), bad=7)
  options = dict(resolution=32, difficulty='hard', source='release')
  with pytest.raises(UserError, match=r"1\.npy, line 3: label '7'"):
    tasks.get_task('pathfinder').ensure_prepared(
      str(tmp_path), options, progress=False
    )


def test_release_wrong_size_names_file_and_line(tmp_path):
  root, _ = _write_release(str(tmp_path), n=6)
  Image.fromarray(np.zeros((16, 16), np.uint8)).save(
    os.path.join(root, 'imgs', '0', 'sample_2.png')
  )
  options = dict(resolution=32, difficulty='hard', source='release')
  with pytest.raises(UserError, match=r'0\.npy, line 2: .* 16 x 16'):
    tasks.get_task('pathfinder').ensure_prepared(
      str(tmp_path), options, progress=False
    )


def test_missing_release_says_where_to_put_it(tmp_path):
  options = dict(resolution=128, difficulty='hard', source='release')
  with pytest.raises(UserError, match='pathx/release/'):
    tasks.get_task('pathx').ensure_prepared(
      str(tmp_path), options, progress=False
    )


# ---------------------------------------------------------------- figure


def test_example_figure(tmp_path):
  # docs/pathfinder_examples.png is this figure, made by
  # `python -m lra.pathfinder --examples docs/pathfinder_examples.png`.
  path = str(tmp_path / 'examples.png')
  pathfinder.save_examples(path)
  with Image.open(path) as im:
    assert im.size[0] > 500 and im.size[1] > 200
