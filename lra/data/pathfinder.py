r"""Pathfinder and Path-X (LRA): do the two markers lie on one dashed path?

Images of dashed curves ('snakes'), two of them marked with a disc each;
label 1 when the markers are the two ends of one snake, 0 when they sit on
two different snakes. lra/data/pathfinder_gen.py generates them as the original
generator did for the LRA release (its statistics match: `--stats`). The
model reads the image as a sequence of resolution**2 gray pixels
(row-major, 0..255; 0 is a black pixel, not padding, unless
data.black_is_padding, as the reference). LRA's Pathfinder is 32 x 32
(1,024 tokens); Path-X is the same task at 128 x 128 (16,384 tokens). Both
tasks ('pathfinder', 'pathx') use this module; they differ only in their
configs.

Data options (the config's `data` block):
  resolution    32, 64, 128 or 256.
  difficulty    'easy', 'intermediate' or 'hard': 6, 9 or 14 paddles per
                target snake (LRA: hard).
  num_examples  generated images, split 80/10/10 (200,000 -> 160k/20k/20k);
                exactly half of each split is positive.
  source        'generate' (lra/data/pathfinder_gen.py, seeded), 'release' (the
                official files, below) or 'auto' (the release files when
                they are there, else generate).
  seed          generator and split seed.
  variant       optional shorthand ('full', 'small', 'smoke') for the
                difficulty and size of the config presets.
  workers       generator processes (default: the CPUs, at most 8).
  black_is_padding  read by the model builder, not here: True masks pixel
                0 as padding, as the reference (key padding, pooling).

Release files: LRA's lra_release.gz (https://storage.googleapis.com/
long-range-arena/lra_release.gz) holds lra_release/pathfinder{32,64,128,256}/
<folder>/{imgs/<k>/sample_<i>.png, metadata/<k>.npy}, one folder per
difficulty: curv_baseline (easy), curv_contour_length_9 (intermediate),
curv_contour_length_14 (hard).
Move the folder of your resolution under the task's data folder:
  lra_release/pathfinder32  -> <data_dir>/pathfinder/release/pathfinder32
  lra_release/pathfinder128 -> <data_dir>/pathx/release/pathfinder128
(either task folder is searched). Each metadata/<k>.npy is a TEXT file
despite its name, one image per line: `imgs/<k> sample_<i>.png <index>
<label> ...`. Unreadable images are skipped and counted; the images are
shuffled with the seed and split 80/10/10 (num_examples is ignored).

Cache: `<data_dir>/<task>/<resolution>_<difficulty>_v<G>[_n<N>][_seed<S>]`
for generated images (G: the generator's VERSION; caches of an older
generator, e.g. `32_hard`, are never reused and may be deleted),
`<resolution>_<difficulty>_release[_seed<S>]` for the
release files (also when source='auto' found them): inputs uint8 [N,
resolution**2], labels int32. The splits are written row by row into
memory-mapped files, so Path-X (3.3 GB) never sits in memory.

  python -m lra.data.prepare pathfinder                  # 32 px, hard, 200k
  python -m lra.data.pathfinder --examples docs/pathfinder_examples.png
  python -m lra.data.pathfinder --rate 32                # images/s of this CPU
  python -m lra.data.pathfinder --stats --difficulty easy  # image statistics,
      # beside the release's when its folder is under the data dir
"""

import argparse
import concurrent.futures
import contextlib
import dataclasses
import logging
import multiprocessing
import os
import sys
import time

import numpy as np
import tqdm

from lra.data import cache
from lra.data import pathfinder_gen as gen
from lra.errors import UserError

log = logging.getLogger(__name__)

OPTIONS = (
  'resolution',
  'difficulty',
  'num_examples',
  'source',
  'seed',
  'variant',
  'workers',
  'downsample',
  'black_is_padding',  # read by the model builder, not by the data
)
DOWNSAMPLE_MODES = ('max', 'mean')
SOURCES = ('auto', 'generate', 'release')
# The release's folder per difficulty (lra_benchmarks/data/pathfinder.py):
# the 6-paddle set is the generator's baseline condition.
RELEASE_FOLDERS = {
  'easy': 'curv_baseline',
  'intermediate': 'curv_contour_length_9',
  'hard': 'curv_contour_length_14',
}
FULL_SIZE = 200_000
# Shorthands for the presets' data (explicit options win).
VARIANTS = {
  'full': dict(difficulty='hard', num_examples=FULL_SIZE),
  'small': dict(difficulty='easy', num_examples=20_000),
  'smoke': dict(difficulty='easy', num_examples=320),
}


# ---------------------------------------------------------------- options


def _options(options):
  unknown = sorted(set(options) - set(OPTIONS))
  if unknown:
    raise UserError(
      f'Unknown Pathfinder option {unknown[0]!r}; known: {", ".join(OPTIONS)}.'
    )
  variant = options.get('variant') or 'full'
  if variant not in VARIANTS:
    raise UserError(
      f'Unknown Pathfinder variant {variant!r}; known: {", ".join(VARIANTS)}.'
    )
  o = dict(
    resolution=32, source='auto', seed=0, downsample=1, **VARIANTS[variant]
  )
  o.update({k: v for k, v in options.items() if k != 'variant'})
  for key in ('resolution', 'seed', 'num_examples', 'downsample'):
    try:
      o[key] = int(o[key])
    except (TypeError, ValueError):
      raise UserError(
        f'Pathfinder option {key}={o[key]!r} is not a whole number; give one.'
      ) from None
  if o['resolution'] not in gen.RESOLUTIONS:
    raise UserError(
      f'Pathfinder resolution {o["resolution"]} is not one of '
      f'{", ".join(map(str, gen.RESOLUTIONS))}; set data.resolution to one.'
    )
  if o['downsample'] < 1 or o['resolution'] % o['downsample']:
    raise UserError(
      f'data.downsample={o["downsample"]} does not divide the resolution '
      f'{o["resolution"]}; use 1 (none) or a divisor such as 2.'
    )
  if o['difficulty'] not in gen.CONTOUR_LENGTHS:
    raise UserError(
      f'Unknown Pathfinder difficulty {o["difficulty"]!r}; use one of '
      f'{", ".join(gen.CONTOUR_LENGTHS)}.'
    )
  if o['source'] not in SOURCES:
    raise UserError(
      f'Unknown data.source {o["source"]!r}; use one of {", ".join(SOURCES)}.'
    )
  if o['num_examples'] < 10:
    raise UserError(
      f'num_examples {o["num_examples"]} is too small; use at least 10.'
    )
  return o


def resolve(options, data_dir):
  """source='auto' becomes 'release' when the release folder of these
  options is under data_dir, else 'generate' (see lra/data/__init__.py)."""
  o = _options(options)
  if o['source'] != 'auto':
    return options
  found = release_dir(data_dir, o['resolution'], o['difficulty'])
  return {**options, 'source': 'release' if found else 'generate'}


def cache_name(options):
  """'32_hard_v2' for generated images (v: the generator's VERSION, so a
  cache of another generator is never reused), '_n<N>' and '_seed<S>' when
  not the defaults; '32_hard_release' (never '_n<N>') for the release."""
  o = _options(options)
  name = f'{o["resolution"]}_{o["difficulty"]}'
  if o['source'] == 'release':
    name += '_release'
  else:
    name += f'_v{gen.VERSION}'
    if o['num_examples'] != FULL_SIZE:
      name += f'_n{o["num_examples"]}'
  return name + (f'_seed{o["seed"]}' if o['seed'] else '')


def downsample(inputs, resolution, factor):
  """Images uint8 [n, resolution**2] shrunk by `factor` per side: each
  factor x factor block becomes its brightest pixel (max pooling keeps the
  one-pixel-wide dashes and the markers at full contrast; a block mean
  would fade them), [n, (resolution // factor)**2]."""
  if factor == 1:
    return inputs
  n, side = len(inputs), resolution // factor
  blocks = np.asarray(inputs).reshape(n, side, factor, side, factor)
  return blocks.max(axis=(2, 4)).reshape(n, side * side)


def transform(splits, options):
  """The loaded splits as the model reads them: `data.downsample` > 1
  shrinks every image after loading (the cache keeps the full images)."""
  o = _options(options)
  return {
    s: (downsample(x, o['resolution'], o['downsample']), y)
    for s, (x, y) in splits.items()
  }


def split_sizes(num):
  """80/10/10: (train, val, test)."""
  val = test = num // 10
  return num - val - test, val, test


def balanced_labels(size, rng):
  """size // 2 ones and the rest zeros, shuffled."""
  labels = np.zeros(size, np.int32)
  labels[: size // 2] = 1
  return rng.permutation(labels)


# ---------------------------------------------------------------- writing


class _SplitWriter:
  """Writes the three splits' inputs row by row into memory-mapped .npy
  files (renamed into place when complete), then their labels."""

  def __init__(self, cache_dir, sizes, width):
    os.makedirs(cache_dir, exist_ok=True)
    self.dir, self.sizes, self.width = cache_dir, sizes, width
    self.starts = np.cumsum((0,) + tuple(sizes))
    self.arrays = [
      np.lib.format.open_memmap(
        self._path(s) + '.tmp', 'w+', np.uint8, (n, width)
      )
      for s, n in zip(cache.SPLITS, sizes)
    ]

  def _path(self, split, name='inputs'):
    return os.path.join(self.dir, f'{split}_{name}.npy')

  def write(self, offset, rows):
    """Rows numbered from `offset` over the concatenated splits."""
    for k, arr in enumerate(self.arrays):
      lo = max(offset, self.starts[k])
      hi = min(offset + len(rows), self.starts[k + 1])
      if lo < hi:
        arr[lo - self.starts[k] : hi - self.starts[k]] = rows[
          lo - offset : hi - offset
        ]

  def close(self, labels, counts=None):
    """Finishes the files; counts < sizes keeps only the first rows."""
    for k, split in enumerate(cache.SPLITS):
      arr, path = self.arrays[k], self._path(split)
      n = self.sizes[k] if counts is None else counts[k]
      if n < len(arr):  # skipped images: copy the rows kept
        small = np.lib.format.open_memmap(
          path + '.tmp2', 'w+', np.uint8, (n, self.width)
        )
        for i in range(0, n, 4096):
          small[i : i + 4096] = arr[i : min(i + 4096, n)]
        small.flush()
        del small
        os.replace(path + '.tmp2', path + '.tmp')
      else:
        arr.flush()
      self.arrays[k] = None
      del arr
      os.replace(path + '.tmp', path)
      lpath = self._path(split, 'labels')
      with open(lpath + '.tmp', 'wb') as f:
        np.save(f, np.asarray(labels[k][:n], np.int32))
      os.replace(lpath + '.tmp', lpath)


# ---------------------------------------------------------------- generator


def _chunk_task(args):
  return gen.generate_chunk(*args)


def _pooled(jobs, workers):
  """Yields _chunk_task(job) in order, computed by `workers` processes."""
  # spawn, not fork: the caller may have started JAX's threads.
  ctx = multiprocessing.get_context('spawn')
  ex = concurrent.futures.ProcessPoolExecutor(workers, mp_context=ctx)
  pending, jobs = [], iter(jobs)
  try:
    while True:
      for job in jobs:
        pending.append(ex.submit(_chunk_task, job))
        if len(pending) >= 2 * workers:
          break
      if not pending:
        return
      yield pending.pop(0).result()
  finally:
    ex.shutdown(cancel_futures=True)


def generate(labels, resolution, difficulty, seed, workers=0, progress=False):
  """Yields (offset, images uint8 [n, resolution**2]) in order.

  Chunk i (gen.CHUNK images) draws from (seed, i), so the images do not
  depend on the number of worker processes.
  """
  length = gen.CONTOUR_LENGTHS[difficulty]
  labels = np.asarray(labels)
  jobs = [
    (labels[i : i + gen.CHUNK], resolution, length, seed, i // gen.CHUNK)
    for i in range(0, len(labels), gen.CHUNK)
  ]
  if workers > 1 and len(jobs) > 1:
    results = _pooled(jobs, workers)
  else:
    results = (_chunk_task(job) for job in jobs)
  desc = f'pathfinder{resolution} {difficulty}'
  with (
    contextlib.closing(results),
    tqdm.tqdm(
      total=len(labels), unit='img', desc=desc, disable=not progress
    ) as bar,
  ):
    offset = 0
    for images in results:
      yield offset, images
      offset += len(images)
      bar.update(len(images))


def _default_workers(num):
  if num < 4 * gen.CHUNK:
    return 0  # starting processes would cost more than it saves
  try:
    cpus = len(os.sched_getaffinity(0))
  except AttributeError:
    cpus = os.cpu_count() or 1
  return min(8, cpus)


def _prepare_generated(cache_dir, o, progress):
  res, seed = o['resolution'], o['seed']
  sizes = split_sizes(o['num_examples'])
  labels = [
    balanced_labels(n, np.random.default_rng([seed, 1 << 30, k]))
    for k, n in enumerate(sizes)
  ]
  workers = int(o.get('workers') or _default_workers(o['num_examples']))
  log.info(
    'Pathfinder %d px %s: generating %d images (seed %d, %d workers) in %s.',
    res,
    o['difficulty'],
    o['num_examples'],
    seed,
    workers,
    cache_dir,
  )
  start = time.time()
  writer = _SplitWriter(cache_dir, sizes, res * res)
  for offset, images in generate(
    np.concatenate(labels), res, o['difficulty'], seed, workers, progress
  ):
    writer.write(offset, images)
  writer.close(labels)
  seconds = time.time() - start
  return dict(
    source='generated',
    seed=seed,
    generator_version=gen.VERSION,
    params=dataclasses.asdict(gen.RESOLUTIONS[res]),
    images_per_second=round(o['num_examples'] / max(seconds, 1e-9), 1),
    counts=dict(zip(cache.SPLITS, sizes)),
    positives={s: int(x.sum()) for s, x in zip(cache.SPLITS, labels)},
  )


# ---------------------------------------------------------------- release


def release_dir(data_dir, resolution, difficulty):
  """The release folder of these options, or None when it is absent."""
  tasks = (
    ('pathx', 'pathfinder') if resolution >= 128 else ('pathfinder', 'pathx')
  )
  sub = os.path.join(f'pathfinder{resolution}', RELEASE_FOLDERS[difficulty])
  for t in tasks:
    path = os.path.join(data_dir, t, 'release', sub)
    if os.path.isdir(os.path.join(path, 'metadata')):
      return path
  return None


def _metadata_rows(path):
  """Yields (line number, fields) of one metadata file."""
  with open(path, 'rb') as f:
    magic = f.read(6)
  if magic == b'\x93NUMPY':  # a real .npy of strings, as np.save made it
    rows = np.load(path, allow_pickle=False)
    for i, row in enumerate(np.atleast_2d(rows), 1):
      yield i, [str(x) for x in row]
    return
  with open(path, encoding='utf-8', errors='replace') as f:
    for i, line in enumerate(f, 1):
      if line.strip():
        yield i, line.split()


def read_release_index(root):
  """[(image path, label, metadata file, line)] of a release folder."""
  meta = os.path.join(root, 'metadata')
  names = [n for n in os.listdir(meta) if n.endswith('.npy')]
  names.sort(key=lambda n: (0, int(n[:-4])) if n[:-4].isdigit() else (1, n))
  entries = []
  for name in names:
    path = os.path.join(meta, name)
    for line_no, fields in _metadata_rows(path):
      if len(fields) < 4:
        raise UserError(
          f'{path}, line {line_no}: expected "imgs/<k> sample_<i>.png '
          '<index> <label> ...", got too few fields; fix or delete that line.'
        )
      if fields[3] not in ('0', '1'):
        raise UserError(
          f'{path}, line {line_no}: label {fields[3]!r} is not 0 or 1; fix '
          'or delete that line.'
        )
      entries.append(
        (
          os.path.join(root, fields[0], fields[1]),
          int(fields[3]),
          path,
          line_no,
        )
      )
  if not entries:
    raise UserError(
      f'{meta} lists no images; extract the release archive again.'
    )
  return entries


def _read_png(path, resolution, meta, line_no):
  """Pixels uint8 [resolution**2], or None when the file is unreadable."""
  from PIL import Image  # only the release path needs PIL

  try:
    with Image.open(path) as im:
      im.load()
      size = im.size
      pixels = np.asarray(im.convert('L'), np.uint8)
  except (OSError, ValueError, SyntaxError):
    return None
  if size != (resolution, resolution):
    raise UserError(
      f'{meta}, line {line_no}: {path} is {size[0]} x {size[1]}, not '
      f'{resolution} x {resolution}; put pathfinder{resolution} files in '
      f'the pathfinder{resolution} folder.'
    )
  return pixels.reshape(-1)


def _prepare_release(cache_dir, root, o, progress):
  res = o['resolution']
  entries = read_release_index(root)
  order = np.random.default_rng(o['seed']).permutation(len(entries))
  sizes = split_sizes(len(entries))
  log.info(
    'Pathfinder: converting %d release images from %s.', len(entries), root
  )
  writer = _SplitWriter(cache_dir, sizes, res * res)
  labels = [np.zeros(n, np.int32) for n in sizes]
  counts, skipped, done = [0, 0, 0], 0, 0
  block = np.zeros((256, res * res), np.uint8)
  with tqdm.tqdm(
    total=len(entries),
    unit='img',
    desc=f'pathfinder{res}',
    disable=not progress,
  ) as bar:
    for k, n in enumerate(sizes):
      base, fill = writer.starts[k], 0
      for i in order[done : done + n]:
        path, label, meta, line_no = entries[i]
        pixels = _read_png(path, res, meta, line_no)
        bar.update(1)
        if pixels is None:
          skipped += 1
          continue
        block[fill] = pixels
        labels[k][counts[k]] = label
        counts[k] += 1
        fill += 1
        if fill == len(block):
          writer.write(base + counts[k] - fill, block)
          fill = 0
      writer.write(base + counts[k] - fill, block[:fill])
      done += n
  if skipped:
    print(f'warning: skipped {skipped} unreadable images in {root}')
  if not sum(counts):
    raise UserError(
      f'No readable image under {root}; extract the release archive again.'
    )
  writer.close(labels, counts)
  return dict(
    source='release',
    release_dir=root,
    seed=o['seed'],
    skipped=skipped,
    counts=dict(zip(cache.SPLITS, counts)),
    positives={
      s: int(x[:c].sum()) for s, x, c in zip(cache.SPLITS, labels, counts)
    },
  )


# ---------------------------------------------------------------- task API


def _remove_partial(cache_dir):
  """Deletes the unfinished files of an interrupted prepare."""
  if os.path.isdir(cache_dir):
    for name in os.listdir(cache_dir):
      if name.endswith(('.tmp', '.tmp2')):
        os.remove(os.path.join(cache_dir, name))


def prepare(cache_dir, data_dir, options, progress):
  """Converts the release files or generates the images (see above)."""
  o = _options(options)
  res, difficulty = o['resolution'], o['difficulty']
  root = release_dir(data_dir, res, difficulty)
  start = time.time()
  use_release = o['source'] == 'release' or (o['source'] == 'auto' and root)
  if use_release and root is None:
    folder = RELEASE_FOLDERS[difficulty]
    task = 'pathx' if res >= 128 else 'pathfinder'
    raise UserError(
      f'Pathfinder release files not found: expected {data_dir}/{task}/'
      f'release/pathfinder{res}/{folder}/metadata; '
      f'extract lra_release.gz and move lra_release/pathfinder{res} to '
      f"{data_dir}/{task}/release/, or set data.source='generate'."
    )
  try:
    if use_release:
      info = _prepare_release(cache_dir, root, o, progress)
    else:
      info = _prepare_generated(cache_dir, o, progress)
  except BaseException:
    _remove_partial(cache_dir)
    raise
  info.update(
    resolution=res,
    difficulty=difficulty,
    contour_length=gen.CONTOUR_LENGTHS[difficulty],
    width=res * res,
    seconds=round(time.time() - start, 1),
  )
  cache.write_info(cache_dir, **info)
  for split in cache.SPLITS:
    cache.write_record(cache_dir, split)
  log.info('Pathfinder: %s in %.1f s.', info['counts'], info['seconds'])


# ---------------------------------------------------------------- examples


def save_examples(path, seed=0):
  """A figure of 4 positive + 4 negative 32-px images and 2 at 128 px."""
  import matplotlib

  matplotlib.use('Agg')
  import matplotlib.pyplot as plt

  length = gen.CONTOUR_LENGTHS['hard']
  small = gen.generate_chunk(
    np.array([1, 1, 1, 1, 0, 0, 0, 0]), 32, length, seed, 0
  )
  large = gen.generate_chunk(np.array([1, 0]), 128, length, seed, 0)
  fig, axes = plt.subplots(2, 5, figsize=(12.5, 6.0))
  for row in range(2):
    label = 1 - row
    cells = [(small[4 * row + i], 32) for i in range(4)]
    cells.append((large[row], 128))
    for ax, (img, res) in zip(axes[row], cells):
      ax.imshow(
        img.reshape(res, res),
        cmap='gray',
        vmin=0,
        vmax=255,
        interpolation='nearest',
      )
      what = 'connected' if label else 'not connected'
      ax.set_title(f'{res} px, label {label} ({what})', fontsize=9)
      ax.set_xticks([])
      ax.set_yticks([])
  fig.suptitle('Generated Pathfinder (hard, 14 paddles per target snake)')
  fig.tight_layout()
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  fig.savefig(path, dpi=80)
  plt.close(fig)


def measure_rate(resolution, num, difficulty='hard', workers=0):
  """Generated images per second on this machine."""
  labels = np.arange(num) % 2
  start = time.time()
  for _ in generate(labels, resolution, difficulty, 0, workers, True):
    pass
  return num / (time.time() - start)


# ---------------------------------------------------------------- statistics

HIST_BINS = 8  # histogram of nonzero intensities: bins of 32 gray levels


def detect_markers(images):
  """[n, 2, 2] (row, column): the two brightest 3 x 3 blobs of each image
  [n, res, res] (a marker is a disc, a paddle a thin line); the second at
  least 3 px from the first."""
  x = images.astype(np.int32)
  n, res = x.shape[0], x.shape[1]
  pad = np.pad(x, ((0, 0), (1, 1), (1, 1)))
  box = sum(
    pad[:, i : i + res, j : j + res] for i in range(3) for j in range(3)
  )
  out = np.zeros((n, 2, 2), np.int64)
  yy, xx = np.mgrid[:res, :res]
  for k in range(2):
    flat = box.reshape(n, -1).argmax(1)
    out[:, k] = np.stack([flat // res, flat % res], 1)
    near = (np.abs(yy - out[:, k, 0, None, None]) < 3) & (
      np.abs(xx - out[:, k, 1, None, None]) < 3
    )
    box = np.where(near, -1, box)
  return out


def distance_auc(ends, labels):
  """AUC of -(distance between the two markers) for label 1: 0.5 = the
  distance tells nothing; 1 = connected markers are always closer."""
  d = np.hypot(*(ends[:, 0] - ends[:, 1]).T.astype(np.float64))
  pos, neg = d[labels == 1], d[labels == 0]
  if not len(pos) or not len(neg):
    return float('nan')
  less = (pos[:, None] < neg[None, :]).mean()
  ties = (pos[:, None] == neg[None, :]).mean()
  return float(less + ties / 2)


def image_stats(images, labels, ends=None, distractors=None):
  """Statistics of uint8 images [n, res, res] (dict of name -> value)."""
  from scipy import ndimage  # a jax dependency; only --stats needs it

  x = np.asarray(images)
  labels = np.asarray(labels)
  nonzero = x[x > 0]
  hist = np.histogram(nonzero, HIST_BINS, (0, 256))[0] / max(len(nonzero), 1)
  eight = np.ones((3, 3))
  parts = {
    t: np.mean([ndimage.label(img > t, eight)[1] for img in x])
    for t in (0, 128)
  }
  found = detect_markers(x)
  out = {
    'images': len(x),
    'ink fraction (> 0)': float((x > 0).mean()),
    'ink fraction (> 128)': float((x > 128).mean()),
    'mean intensity': float(x.mean()),
    'std intensity': float(x.std()),
    'ink components (> 0)': float(parts[0]),
    'ink components (> 128)': float(parts[128]),
    'marker distance AUC (detected)': distance_auc(found, labels),
  }
  if ends is not None:
    out['marker distance AUC (true)'] = distance_auc(ends, labels)
    hit = (np.abs(np.sort(found, 1) - np.sort(ends, 1)) <= 1).all((1, 2))
    out['markers detected within 1 px'] = float(hit.mean())
  if distractors is not None:
    out['distractor snakes placed'] = float(np.mean(distractors))
    counts = np.bincount(distractors, minlength=1) / len(distractors)
    out['distractor snakes placed: 0/1/2/3+'] = '/'.join(
      f'{v:.2f}' for v in list(counts[:3]) + [counts[3:].sum()]
    )
  for b in range(HIST_BINS):
    out[f'nonzero in {32 * b:3d}-{32 * b + 31:3d}'] = float(hist[b])
  return out


def generated_stats(resolution, difficulty, num, seed=0):
  """image_stats of `num` generated images (labels alternate)."""
  length = gen.CONTOUR_LENGTHS[difficulty]
  labels = np.arange(num) % 2
  geom = gen.chunk_geometry(num, resolution, length, seed, 0)
  ends = gen.markers(geom, labels)
  images = gen.render(geom, ends, resolution)
  return image_stats(images, labels, ends, geom['distractors'])


def release_stats(root, resolution, num, seed=0):
  """image_stats of `num` release images drawn with the seed."""
  entries = read_release_index(root)
  order = np.random.default_rng(seed).permutation(len(entries))[:num]
  images, labels = [], []
  for i in order:
    path, label, meta, line_no = entries[i]
    pixels = _read_png(path, resolution, meta, line_no)
    if pixels is not None:
      images.append(pixels.reshape(resolution, resolution))
      labels.append(label)
  if not images:
    raise UserError(f'No readable image under {root}; extract it again.')
  return image_stats(np.stack(images), np.asarray(labels))


def format_stats(columns):
  """Text table of {column name: image_stats dict}, with text bars for the
  histogram."""
  names = list(columns)
  keys = []
  for c in columns.values():
    keys += [k for k in c if k not in keys]
  width = max(len(k) for k in keys) + 2
  lines = [' ' * width + ''.join(f'{n:>22}' for n in names)]
  for k in keys:
    cells = []
    for n in names:
      v = columns[n].get(k, '-')
      if isinstance(v, float) and k.startswith('nonzero'):
        v = f'{v:5.3f} ' + '#' * int(round(v * 40))
        cells.append(f'  {v:<20}')
      elif isinstance(v, float):
        cells.append(f'{v:>22.4g}')
      else:
        cells.append(f'{v!s:>22}')
    lines.append(f'{k:<{width}}' + ''.join(cells))
  return '\n'.join(lines)


def stats_report(resolution, difficulty, num, seed=0, data_dir=None):
  """The --stats text: generated images, and the release's when present."""
  columns = {'generated': generated_stats(resolution, difficulty, num, seed)}
  root = data_dir and release_dir(data_dir, resolution, difficulty)
  if root:
    columns['release'] = release_stats(root, resolution, num, seed)
  title = (
    f'Pathfinder {resolution} px, {difficulty} '
    f'({gen.CONTOUR_LENGTHS[difficulty]} paddles per target), seed {seed}'
  )
  where = root or (
    f'no release folder under {data_dir}' if data_dir else 'no data dir'
  )
  return f'{title}; release: {where}\n{format_stats(columns)}'


def main(argv=None):
  parser = argparse.ArgumentParser(
    prog='python -m lra.data.pathfinder', description=__doc__.split('\n')[0]
  )
  parser.add_argument('--examples', metavar='PNG', help='save example grid')
  parser.add_argument(
    '--rate',
    type=int,
    metavar='RES',
    help='measure generated images/s at this resolution',
  )
  parser.add_argument(
    '--stats',
    action='store_true',
    help="print image statistics (and the release folder's, if present)",
  )
  parser.add_argument('--resolution', type=int, default=32, help='--stats')
  parser.add_argument(
    '--num', type=int, help='images for --rate (8192) or --stats (2000)'
  )
  parser.add_argument('--difficulty', default='hard')
  parser.add_argument('--seed', type=int, default=0, help='--stats')
  parser.add_argument(
    '--data_dir', help='--stats: where to look for the release'
  )
  parser.add_argument('--workers', type=int, default=0)
  args = parser.parse_args(argv)
  try:
    o = _options(
      dict(resolution=args.resolution, difficulty=args.difficulty, seed=0)
    )
    if args.examples:
      save_examples(args.examples)
      print(f'wrote {args.examples}')
    if args.rate:
      num = args.num or 8192
      rate = measure_rate(args.rate, num, o['difficulty'], args.workers)
      print(
        f'{args.rate} px {args.difficulty}: {rate:.1f} images/s with '
        f'{args.workers} workers; 200,000 in {FULL_SIZE / rate / 60:.1f} min'
      )
    if args.stats:
      if (args.num or 2000) < 2:
        raise UserError('--num must be at least 2 for --stats; give more.')
      from lra import data as tasks  # pylint: disable=g-import-not-at-top

      data_dir = args.data_dir or tasks.default_data_dir()
      print(
        stats_report(
          o['resolution'],
          o['difficulty'],
          args.num or 2000,
          args.seed,
          data_dir,
        )
      )
  except UserError as e:
    print(f'error: {e}', file=sys.stderr)
    return 2
  return 0


if __name__ == '__main__':
  sys.exit(main())
