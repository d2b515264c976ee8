"""What generated Pathfinder images look like: statistics and examples.

`python -m lra.data.pathfinder --stats` prints image_stats of generated
images (ink fraction and intensity, connected components, the marker
distance AUC: how much the markers' distance alone tells the label,
distractor snakes placed, the histogram of ink intensities) beside the
release's when its folder is under the data directory, so the generator's
distribution can be compared with the images LRA trained on.
`--examples PNG` draws a grid of generated images.
"""

import os

import numpy as np

from lra.data import pathfinder_draw as draw
from lra.data import pathfinder_gen as gen
from lra.data.pathfinder_release import (
  read_png,
  read_release_index,
  release_dir,
)
from lra.errors import UserError


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
  ends = draw.markers(geom, labels)
  images = draw.render(geom, ends, resolution)
  return image_stats(images, labels, ends, geom['distractors'])


def release_stats(root, resolution, num, seed=0):
  """image_stats of `num` release images drawn with the seed."""
  entries = read_release_index(root)
  order = np.random.default_rng(seed).permutation(len(entries))[:num]
  images, labels = [], []
  for i in order:
    path, label, meta, line_no = entries[i]
    pixels = read_png(path, resolution, meta, line_no)
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
