"""Pathfinder / Path-X: the generator, its statistics, the release reader
and the cache."""

import os

import numpy as np
from PIL import Image
import pytest
import release_fixtures as fx

from configs import pathfinder as pathfinder_config
from lra import data as tasks
from lra.data import cache, pathfinder, pathfinder_stats
from lra.data import pathfinder_draw as draw
from lra.data import pathfinder_gen as gen
from lra.errors import UserError
from models.classifier import build_model

HARD = gen.CONTOUR_LENGTHS['hard']
EASY = gen.CONTOUR_LENGTHS['easy']


def _chunk(labels, res=32, length=HARD, seed=0, index=0):
  return gen.generate_chunk(np.asarray(labels), res, length, seed, index)


@pytest.fixture(scope='module')
def hard_geometry():
  """256 hard 32-px images of seed 0 (shared; never modify)."""
  return gen.chunk_geometry(256, 32, HARD, seed=0, index=0)


def test_generator_is_deterministic_and_seeded():
  labels = np.arange(16) % 2
  a, b = _chunk(labels), _chunk(labels)
  np.testing.assert_array_equal(a, b)
  assert not np.array_equal(a, _chunk(labels, seed=1))
  assert not np.array_equal(a, _chunk(labels, index=1))


@pytest.mark.parametrize('size', [(17, 9), (64, 32), (41, 21), (20, 40)])
def test_resize_is_pillows_lanczos_exactly(size):
  """The original downsampled with scipy.misc.imresize: Pillow's 8-bit
  Lanczos filter. Ours must give the same bytes."""
  n_in, n_out = size
  rng = np.random.default_rng(n_in)
  img = rng.integers(0, 256, (3, n_in, n_in)).astype(np.uint8)
  img[0] = 0
  img[0, n_in // 2, 2:-2] = 255  # a line, as the paddle canvases
  ours = draw.resize(img, n_out)
  for a, b in zip(img, ours):
    want = Image.fromarray(a).resize((n_out, n_out), Image.Resampling.LANCZOS)
    np.testing.assert_array_equal(b, np.asarray(want))


@pytest.mark.parametrize('res', [32, 128])
def test_images_are_min_max_rescaled_and_antialiased(res):
  images = _chunk(np.arange(2) % 2, res=res)
  assert images.dtype == np.uint8 and images.shape == (2, res * res)
  for img in images:
    assert img.min() == 0 and img.max() == 255  # the original's bytescale
    levels = np.unique(img)
    assert len(levels) > 20  # antialiased: many intermediate levels
    assert np.mean(img > 128) < np.mean(img > 0) / 2  # most ink is faint
    assert np.mean(img == 0) > 0.5  # mostly background


def test_one_snake_renders_as_the_original(hard_geometry):
  """One target snake alone, a copy of it as a distractor elsewhere: the
  paddles are antialiased, the image min-max rescaled, and the distractor
  (contrast 2) brighter than the target (paddle contrast 0.75 x 2)."""
  p = draw.RESOLUTIONS[32]
  g = {k: v[:1].copy() for k, v in hard_geometry.items()}
  paddles = g['paddles'][0]
  target = paddles[(paddles[:, 4] > 0) & (paddles[:, 3] == p.target_contrast)]
  assert len(target) == 2 * HARD
  one = target[0::2].copy()  # recorded alternately: the first target
  assert len({tuple(x) for x in one[:, :2]}) == HARD
  decoy = one.copy()
  decoy[:, 3] = p.distractor_contrast
  g['paddles'] = one[None]
  ends = np.full((1, 2, 2), -100)  # markers off the image
  flt = draw.render(g, ends, 32, rescale=False)[0]
  img = draw.render(g, ends, 32)[0]
  assert img.min() == 0 and img.max() == 255
  # A 1-px line on the 2x canvas, downsampled: never the full contrast.
  assert 0 < flt.max() < p.target_contrast
  middle = img[(img > 0) & (img < 255)]
  assert len(middle) > 2 * np.sum(img == 255)  # antialiased
  # The same paddles as distractors: brighter by exactly 2 / 1.5.
  g['paddles'] = decoy[None]
  flt2 = draw.render(g, ends, 32, rescale=False)[0]
  np.testing.assert_allclose(flt2.max() / flt.max(), 2 / 1.5, rtol=1e-6)
  both = one.copy()
  both[: HARD // 2, 3] = p.distractor_contrast
  g['paddles'] = both[None]
  img = draw.render(g, ends, 32)[0]
  first = draw.render({**g, 'paddles': both[None, : HARD // 2]}, ends, 32)[0]
  assert img[first > 0].max() == 255  # the brightest ink is distractor ink


def test_labels_change_only_the_markers(hard_geometry):
  """The label moves the far marker from the head of one target to the
  head of the other; before the min-max rescale nothing else changes."""
  geom = hard_geometry
  n = len(geom['origin'])
  pos = draw.render(geom, draw.markers(geom, np.ones(n)), 32, rescale=False)
  neg = draw.render(geom, draw.markers(geom, np.zeros(n)), 32, rescale=False)
  yy, xx = np.mgrid[:32, :32]
  near = draw.RESOLUTIONS[32].marker_radius + 3.5  # disc + Lanczos reach
  same = 0
  for i in range(n):
    heads = geom['heads'][i]
    close = np.zeros((32, 32), bool)
    for y, x in heads:
      close |= (yy - y) ** 2 + (xx - x) ** 2 <= near**2
    differ = pos[i] != neg[i]
    assert not differ[~close].any()
    # As in the original, the second target's last paddle may land on the
    # first's (whose mask never joins): one head, both labels alike.
    same += not differ.any()
    assert differ.any() or (heads[0] == heads[1]).all()
  assert same <= n // 50


def test_first_paddles_keep_the_originals_angles():
  """The original's OpenCV dilation leaves only 30 of 360 start angles at
  32 px (up-left, -150..-121 degrees); every snake starts at one."""
  t = draw.tables(32, 1)
  assert t.seed_ok.sum() == 30
  assert list(np.nonzero(t.seed_ok)[0] - 180) == list(range(-150, -120))


def test_distractor_snakes_are_dropped_as_the_originals(hard_geometry):
  """The original run here placed 1.21 of 5 distractor snakes per image on
  'hard' (400 images) and 3.44 of 10 on 'easy' (600): stuck ones are
  dropped, not kept short."""
  hard = hard_geometry['distractors']
  assert 0.95 < hard.mean() < 1.5 and hard.max() <= 5
  easy = gen.chunk_geometry(128, 32, EASY, 0, 0)['distractors']
  assert 2.9 < easy.mean() < 4.0 and easy.max() <= 10


def test_stats_are_reproducible_and_plausible():
  a = pathfinder_stats.generated_stats(32, 'easy', 64, seed=3)
  b = pathfinder_stats.generated_stats(32, 'easy', 64, seed=3)
  assert a == b
  assert a != pathfinder_stats.generated_stats(32, 'easy', 64, seed=4)
  # The original's easy images (600, run here): ink > 0 0.231, > 128 0.052.
  assert 0.18 < a['ink fraction (> 0)'] < 0.29
  assert 0.035 < a['ink fraction (> 128)'] < 0.07
  assert a['markers detected within 1 px'] > 0.9
  assert 0 <= a['marker distance AUC (true)'] <= 1
  text = pathfinder_stats.format_stats({'generated': a})
  assert 'ink fraction (> 0)' in text and '#' in text


def test_stats_cli_puts_the_release_beside(tmp_path, capsys):
  fx.write_pathfinder_release(str(tmp_path), folder='curv_baseline', n=8)
  argv = ['--stats', '--difficulty', 'easy', '--num', '8']
  assert pathfinder.main(argv + ['--data_dir', str(tmp_path)]) == 0
  out = capsys.readouterr().out
  assert 'curv_baseline' in out
  head = out.splitlines()[1]
  assert 'generated' in head and 'release' in head
  assert pathfinder.main(['--stats', '--difficulty', 'extreme']) == 2


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
  name = f'32_easy_v{gen.VERSION}_n320'
  assert path.endswith(os.path.join('pathfinder', name))
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
  v = gen.VERSION
  assert pathfinder.cache_name({}) == f'32_hard_v{v}'  # not an old cache's
  assert pathfinder.cache_name(dict(source='release')) == '32_hard_release'
  assert pathfinder.cache_name(dict(variant='small')) == f'32_easy_v{v}_n20000'


# ---------------------------------------------------------------- release


def test_release_reader_converts_and_skips_unreadable(tmp_path, capsys):
  root, images = fx.write_pathfinder_release(str(tmp_path))
  # sample_3 is empty, sample_5 is not a PNG: both skipped and counted.
  open(os.path.join(root, 'imgs', '1', 'sample_3.png'), 'wb').close()
  with open(os.path.join(root, 'imgs', '1', 'sample_5.png'), 'wb') as f:
    f.write(b'not a png')
  options = dict(resolution=32, difficulty='hard', source='auto')
  path = tasks.get_task('pathfinder').ensure_prepared(
    str(tmp_path), options, progress=False
  )
  assert path.endswith('32_hard_release')  # auto found the release
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


@pytest.mark.parametrize('source', ['auto', 'release'])
def test_easy_reads_the_release_curv_baseline_folder(tmp_path, source):
  """LRA's easy split is curv_baseline (lra_benchmarks/data/pathfinder.py),
  not curv_contour_length_6; auto uses it and says 'release'."""
  _, images = fx.write_pathfinder_release(
    str(tmp_path), folder='curv_baseline', n=20
  )
  task = tasks.get_task('pathfinder')
  options = dict(resolution=32, difficulty='easy', source=source)
  assert task.cache_dir(str(tmp_path), options).endswith('32_easy_release')
  path = task.ensure_prepared(str(tmp_path), options, progress=False)
  got = np.concatenate([cache.load_split(path, s)[0] for s in cache.SPLITS])
  assert sorted(map(bytes, got)) == sorted(map(bytes, images))
  info = cache.os.path.join(path, 'info.json')
  assert '"source": "release"' in open(info).read()


def test_release_bad_label_names_file_and_line(tmp_path):
  root, _ = fx.write_pathfinder_release(str(tmp_path))
  meta = os.path.join(root, 'metadata', '1.npy')
  rows = open(meta).read().splitlines()
  rows[2] = rows[2].replace(' 1 1.0 ', ' 7 1.0 ')
  open(meta, 'w').write('\n'.join(rows) + '\n')
  options = dict(resolution=32, difficulty='hard', source='release')
  with pytest.raises(UserError, match=r"1\.npy, line 3: label '7'"):
    tasks.get_task('pathfinder').ensure_prepared(
      str(tmp_path), options, progress=False
    )


def test_release_wrong_size_names_file_and_line(tmp_path):
  root, _ = fx.write_pathfinder_release(str(tmp_path), n=6)
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
  options = dict(resolution=32, difficulty='easy', source='release')
  with pytest.raises(UserError, match='pathfinder32/curv_baseline/'):
    tasks.get_task('pathfinder').ensure_prepared(
      str(tmp_path), options, progress=False
    )


# ---------------------------------------------------------------- masking


@pytest.mark.parametrize('black_is_padding', [False, True])
def test_black_is_padding_masks_exactly_the_zero_pixels(black_is_padding):
  """data.black_is_padding=true reproduces the reference (pixel 0 is
  padding: key padding and pooling); the default masks nothing."""
  c = pathfinder_config.get_config('transformer,smoke')
  c.data.black_is_padding = black_is_padding
  model = build_model(c, tasks.get_task('pathfinder'))
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, 256, (2, c.max_length))
  tokens[rng.random(tokens.shape) < 0.6] = 0
  _, padding, _ = model.encoder(tokens)
  if not black_is_padding:
    assert padding is None  # every pixel is a real token
    return
  real = np.asarray(padding)[:, -c.max_length :]
  np.testing.assert_array_equal(real, tokens != 0)
  assert np.asarray(padding).shape[1] in (c.max_length, c.max_length + 1)


# ---------------------------------------------------------------- figure


def test_example_figure(tmp_path):
  # docs/pathfinder_examples.png is this figure, made by
  # `python -m lra.data.pathfinder --examples docs/pathfinder_examples.png`.
  path = str(tmp_path / 'examples.png')
  pathfinder_stats.save_examples(path)
  with Image.open(path) as im:
    assert im.size[0] > 500 and im.size[1] > 200


def test_downsample_keeps_each_blocks_brightest_pixel():
  rng = np.random.default_rng(0)
  images = rng.integers(0, 256, (3, 32 * 32), dtype=np.uint8)
  small = pathfinder.downsample(images, 32, 2)
  assert small.shape == (3, 16 * 16) and small.dtype == np.uint8
  grid = images.reshape(3, 32, 32)
  for r, c in [(0, 0), (5, 11), (15, 15)]:
    block = grid[:, 2 * r : 2 * r + 2, 2 * c : 2 * c + 2].reshape(3, 4)
    np.testing.assert_array_equal(small[:, 16 * r + c], block.max(axis=1))
  assert pathfinder.downsample(images, 32, 1) is images
  with pytest.raises(UserError, match='divide the resolution'):
    pathfinder.cache_name(dict(downsample=3))
  # The cache keeps full images: downsample is not part of its name.
  assert pathfinder.cache_name(dict(downsample=2)) == pathfinder.cache_name({})


def test_transform_applies_downsample_to_every_split():
  x = np.arange(2 * 1024, dtype=np.int64).reshape(2, 1024) % 256
  splits = {s: (x.astype(np.uint8), np.array([0, 1])) for s in cache.SPLITS}
  task = tasks.get_task('pathfinder')
  out = task.transform(splits, dict(downsample=2))
  assert {s: v[0].shape for s, v in out.items()} == {
    s: (2, 256) for s in cache.SPLITS
  }
  assert task.transform(splits, {})['train'][0].shape == (2, 1024)
