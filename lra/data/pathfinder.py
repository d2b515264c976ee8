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

The images come from lra/data/pathfinder_gen.py (the snakes) and
lra/data/pathfinder_draw.py (their pixels); lra/data/pathfinder_release.py
reads the release files; --stats and --examples are
lra/data/pathfinder_stats.py.

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
from lra.data import pathfinder_draw as draw
from lra.data import pathfinder_gen as gen
from lra.data import pathfinder_stats as stats
from lra.data.pathfinder_release import (
  RELEASE_FOLDERS,
  read_png,
  read_release_index,
  release_dir,
)
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
  if o['resolution'] not in draw.RESOLUTIONS:
    raise UserError(
      f'Pathfinder resolution {o["resolution"]} is not one of '
      f'{", ".join(map(str, draw.RESOLUTIONS))}; set data.resolution to one.'
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
    params=dataclasses.asdict(draw.RESOLUTIONS[res]),
    images_per_second=round(o['num_examples'] / max(seconds, 1e-9), 1),
    counts=dict(zip(cache.SPLITS, sizes)),
    positives={s: int(x.sum()) for s, x in zip(cache.SPLITS, labels)},
  )


def measure_rate(resolution, num, difficulty='hard', workers=0):
  """Generated images per second on this machine."""
  labels = np.arange(num) % 2
  start = time.time()
  for _ in generate(labels, resolution, difficulty, 0, workers, True):
    pass
  return num / (time.time() - start)


# ---------------------------------------------------------------- release


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
        pixels = read_png(path, res, meta, line_no)
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


# ---------------------------------------------------------------- command line


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
      stats.save_examples(args.examples)
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
        stats.stats_report(
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
