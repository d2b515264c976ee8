"""Plots a person can read: the lab's shared styling (lra/report/curves.py,
lra/bench/report.py).

  series_styles   one style per series: the qualitative tab10 palette; past
                  MANY_SERIES series each also gets its own line style and
                  marker, so no two series look alike even where colours
                  repeat or are hard to tell apart.
  ema             an exponential moving average (bias-corrected, as
                  TensorBoard's smoothing) for noisy training curves, drawn
                  over the faint raw points.
  repel_labels    moves overlapping text labels apart, measured with the
                  renderer's extents, and keeps them inside the axes; a label
                  moved from its place shows its leader line to its point.
"""

import itertools

import numpy as np

# More series than this: line styles and markers besides the colours.
MANY_SERIES = 8
PALETTE = 'tab10'
# Line styles and markers cycled past MANY_SERIES; their lengths (4, 9) and
# the palette's (10) share no factor, so the triples repeat only after 180.
LINESTYLES = ('-', '--', '-.', ':')
MARKERS = ('o', 's', '^', 'D', 'v', 'P', 'X', '*', 'h')


def palette():
  """The tab10 colours."""
  from matplotlib import colormaps  # pylint: disable=g-import-not-at-top

  return list(colormaps[PALETTE].colors)


def darker(color, factor=0.7):
  """`color` (an RGB tuple) darkened towards black: text in a series'
  colour that stays readable on white."""
  return tuple(factor * c for c in color[:3])


def series_styles(names, marker=None):
  """{name: {'color', 'linestyle', 'marker'}}: tab10 colours in order; with
  more than MANY_SERIES names, also a line style and a marker each (cycled
  so that no two of the first 180 share all three). With few series the
  lines are solid and `marker` (None: none) marks every point."""
  names = list(dict.fromkeys(names))
  colors = palette()
  many = len(names) > MANY_SERIES
  styles = {}
  for i, name in enumerate(names):
    styles[name] = {
      'color': colors[i % len(colors)],
      'linestyle': LINESTYLES[i % len(LINESTYLES)] if many else '-',
      'marker': MARKERS[i % len(MARKERS)] if many else marker,
      'markersize': 4.5,
    }
  return styles


def ema(values, weight=None):
  """The exponential moving average of `values` (a list), bias-corrected
  (the first values are not pulled towards 0): s_t = w s_(t-1) + (1 - w)
  x_t divided by 1 - w^t. weight None picks one from the number of points
  (auto_weight). Non-finite values are skipped (the average carries on)."""
  values = np.asarray(values, dtype=np.float64)
  weight = auto_weight(len(values)) if weight is None else weight
  out = np.empty_like(values)
  average, count = 0.0, 0
  for i, x in enumerate(values):
    if np.isfinite(x):
      average = weight * average + (1 - weight) * x
      count += 1
    out[i] = average / (1 - weight**count) if count else np.nan
  return out


def auto_weight(n):
  """A smoothing weight for n points: the EMA of a span of n / 10 points,
  1 - 2 / (span + 1) (none below 20 points, 0.82 for 100, at most 0.95)."""
  span = n / 10
  if span < 2:
    return 0.0
  return float(min(0.95, 1 - 2 / (span + 1)))


def _text_box(text, renderer, pad):
  from matplotlib.text import Text  # pylint: disable=g-import-not-at-top

  if hasattr(text, 'update_positions'):
    text.update_positions(renderer)  # an annotation: its text moved
  return Text.get_window_extent(text, renderer).padded(pad)


def _overlap(a, b):
  """(x, y) overlap in pixels of two boxes (both > 0 when they overlap)."""
  return (
    min(a.x1, b.x1) - max(a.x0, b.x0),
    min(a.y1, b.y1) - max(a.y0, b.y0),
  )


def overlapping_pairs(texts, renderer=None, pad=0.0):
  """[(i, j), ...] of the texts whose rendered boxes overlap."""
  if not texts:
    return []
  fig = texts[0].figure
  renderer = renderer or fig.canvas.get_renderer()
  boxes = [_text_box(t, renderer, pad) for t in texts]
  return [
    (i, j)
    for i, j in itertools.combinations(range(len(boxes)), 2)
    if min(_overlap(boxes[i], boxes[j])) > 0
  ]


def _push(a, b):
  """(axis, amount) that moves box a off box b along the axis of least
  overlap (amount signed, a pixel past touching), or None when apart."""
  ox, oy = _overlap(a, b)
  if ox <= 0 or oy <= 0:
    return None
  axis = 0 if ox < oy else 1
  ca = (a.x0 + a.x1, a.y0 + a.y1)[axis]
  cb = (b.x0 + b.x1, b.y0 + b.y1)[axis]
  sign = -1.0 if ca < cb else 1.0
  return axis, sign * ((ox, oy)[axis] + 1.0)


def repel_labels(ax, texts, avoid=(), iterations=400, pad=2.0):
  """Moves the annotations `texts` (ax.annotate with textcoords='offset
  points') until no two boxes overlap (each box padded by `pad` pixels)
  nor covers a point of `avoid` ((x, y) in data coordinates, e.g. the
  points labelled): each overlapping pair is pushed apart along the axis
  of least overlap, half the way each, a label off a point all the way,
  and every box back inside the axes. Call after the layout is final
  (after tight_layout): the boxes are measured by the renderer in pixels.
  An annotation made with arrowprops (a leader line to its point) shows it
  only when it was moved more than a few points from where it started.
  Returns the number of overlapping pairs left (0 unless the axes cannot
  hold every label)."""
  from matplotlib.transforms import Bbox  # pylint: disable=g-import-not-at-top

  if not texts:
    return 0
  fig = ax.figure
  fig.canvas.draw()
  renderer = fig.canvas.get_renderer()
  frame = ax.get_window_extent(renderer)
  to_points = 72.0 / fig.dpi
  n = len(texts)
  starts = [tuple(t.xyann) for t in texts]
  dots = [
    Bbox.from_bounds(x - 3, y - 3, 6, 6)
    for x, y in (ax.transData.transform(p) for p in avoid)
  ]
  for step in range(iterations):
    boxes = [_text_box(t, renderer, pad) for t in texts]
    shift = np.zeros((n, 2))
    for i, j in itertools.combinations(range(n), 2):
      push = _push(boxes[i], boxes[j])
      if push is None:
        continue
      axis, amount = push  # centres alike: i one way, j the other
      shift[i, axis] += amount / 2
      shift[j, axis] -= amount / 2
    for i, box in enumerate(boxes):
      for dot in dots:
        push = _push(box, dot)
        if push is not None:
          shift[i, push[0]] += push[1]
    if step > iterations // 2:  # cycling: a little jitter breaks ties
      shift += np.random.default_rng(step).uniform(-1, 1, shift.shape)
    for i, box in enumerate(boxes):  # back inside the axes
      shift[i, 0] += max(0.0, frame.x0 - (box.x0 + shift[i, 0]))
      shift[i, 0] -= max(0.0, (box.x1 + shift[i, 0]) - frame.x1)
      shift[i, 1] += max(0.0, frame.y0 - (box.y0 + shift[i, 1]))
      shift[i, 1] -= max(0.0, (box.y1 + shift[i, 1]) - frame.y1)
    if not np.abs(shift).max() > 0.01:
      break
    for text, (dx, dy) in zip(texts, shift):
      x, y = text.xyann
      text.xyann = (x + dx * to_points, y + dy * to_points)
  for text, (x0, y0) in zip(texts, starts):  # a leader from a moved label
    if getattr(text, 'arrow_patch', None) is not None:
      x, y = text.xyann
      text.arrow_patch.set_visible(bool(np.hypot(x - x0, y - y0) > 4))
  return len(overlapping_pairs(texts, renderer, 0.0))
