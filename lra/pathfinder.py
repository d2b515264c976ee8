r"""Pathfinder and Path-X (LRA): do the two markers lie on one dashed path?

Images of dashed curves ('snakes'), two of them marked with a disc each;
label 1 when the markers are the two ends of one snake, 0 when they sit on
two different snakes. The model reads the image as a sequence of
resolution**2 gray pixels (row-major, 0..255; 0 is a black pixel, not
padding). LRA's Pathfinder is 32 x 32 (1,024 tokens); Path-X is the same
task at 128 x 128 (16,384 tokens). Both tasks ('pathfinder', 'pathx') use
this module; they differ only in their configs.

Data options (the config's `data` block):
  resolution    32, 64, 128 or 256.
  difficulty    'easy', 'intermediate' or 'hard': 6, 9 or 14 paddles per
                target snake (LRA: hard).
  num_examples  generated images, split 80/10/10 (200,000 -> 160k/20k/20k);
                exactly half of each split is positive.
  source        'generate' (lra/pathfinder_gen.py, seeded), 'release' (the
                official files, below) or 'auto' (the release files when
                they are there, else generate).
  seed          generator and split seed.
  variant       optional shorthand ('full', 'small', 'smoke') for the
                difficulty and size of the config presets.
  workers       generator processes (default: the CPUs, at most 8).

Release files: LRA's lra_release.gz (https://storage.googleapis.com/
long-range-arena/lra_release.gz) holds lra_release/pathfinder{32,64,128,256}/
curv_contour_length_{6,9,14}/{imgs/<k>/sample_<i>.png, metadata/<k>.npy}.
Move the folder of your resolution under the task's data folder:
  lra_release/pathfinder32  -> <data_dir>/pathfinder/release/pathfinder32
  lra_release/pathfinder128 -> <data_dir>/pathx/release/pathfinder128
(either task folder is searched). Each metadata/<k>.npy is a TEXT file
despite its name, one image per line: `imgs/<k> sample_<i>.png <index>
<label> ...`. Unreadable images are skipped and counted; the images are
shuffled with the seed and split 80/10/10 (num_examples is ignored).

Cache: `<data_dir>/<task>/<resolution>_<difficulty>[_n<N>][_seed<S>]` (or
`..._release` for source='release'): inputs uint8 [N, resolution**2],
labels int32. The splits are written row by row into memory-mapped files,
so Path-X (3.3 GB) never sits in memory. With source='auto' the cache keeps
what was found the first time; delete it to switch.

  python -m lra.prepare pathfinder                  # 32 px, hard, 200k
  python -m lra.pathfinder --examples docs/pathfinder_examples.png
  python -m lra.pathfinder --rate 32                # images/s of this CPU
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

from lra import cache
from lra import pathfinder_gen as gen
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
)
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
  o = dict(resolution=32, source='auto', seed=0, **VARIANTS[variant])
  o.update({k: v for k, v in options.items() if k != 'variant'})
  for key in ('resolution', 'seed', 'num_examples'):
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


def cache_name(options):
  """'32_hard'; '_n<N>' and '_seed<S>' when not the defaults, '_release'
  when the release files are asked for explicitly."""
  o = _options(options)
  name = f'{o["resolution"]}_{o["difficulty"]}'
  if o['source'] == 'release':
    name += '_release'
  elif o['num_examples'] != FULL_SIZE:
    name += f'_n{o["num_examples"]}'
  return name + (f'_seed{o["seed"]}' if o['seed'] else '')


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
  sub = os.path.join(
    f'pathfinder{resolution}',
    f'curv_contour_length_{gen.CONTOUR_LENGTHS[difficulty]}',
  )
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
    length = gen.CONTOUR_LENGTHS[difficulty]
    task = 'pathx' if res >= 128 else 'pathfinder'
    raise UserError(
      f'Pathfinder release files not found: expected {data_dir}/{task}/'
      f'release/pathfinder{res}/curv_contour_length_{length}/metadata; '
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


def main(argv=None):
  parser = argparse.ArgumentParser(
    prog='python -m lra.pathfinder', description=__doc__.split('\n')[0]
  )
  parser.add_argument('--examples', metavar='PNG', help='save example grid')
  parser.add_argument(
    '--rate',
    type=int,
    metavar='RES',
    help='measure generated images/s at this resolution',
  )
  parser.add_argument('--num', type=int, default=8192, help='images for --rate')
  parser.add_argument('--difficulty', default='hard')
  parser.add_argument('--workers', type=int, default=0)
  args = parser.parse_args(argv)
  if args.examples:
    save_examples(args.examples)
    print(f'wrote {args.examples}')
  if args.rate:
    rate = measure_rate(args.rate, args.num, args.difficulty, args.workers)
    print(
      f'{args.rate} px {args.difficulty}: {rate:.1f} images/s with '
      f'{args.workers} workers; 200,000 in {FULL_SIZE / rate / 60:.1f} min'
    )
  return 0


if __name__ == '__main__':
  sys.exit(main())
