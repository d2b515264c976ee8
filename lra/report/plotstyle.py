"""Plots a person can read: the project's one styling of every figure it
draws (lra/report/curves.py, lra/bench/report.py, the studies' plots in
experiments/).

  MODEL_STYLES    one fixed colour, marker and line style per model (every
                  registered attention core and sequence mixer, and the
                  transformer's two models): a model looks the same in every
                  figure, whichever other models are drawn beside it.
                  Attention cores are solid lines, sequence mixers dashed;
                  within each family no two models share a colour.
  series_styles   the styles of one figure's series: a model's own, a
                  variant of a model (`gla (bi)`, `transformer [small]`,
                  two runs of one model) its model's colour with another
                  line style or marker, so no two series of a panel share
                  colour, marker and line style.
  panels          more than MAX_PER_PANEL series: one panel per family
                  (attention cores, sequence mixers, others), each cut into
                  panels of at most MAX_PER_PANEL, in MODEL_STYLES's order.
  ema             an exponential moving average (bias-corrected, as
                  TensorBoard's smoothing) for noisy training curves, drawn
                  over the faint raw points.
  repel_labels    moves overlapping text labels apart, measured with the
                  renderer's extents, and keeps them inside the axes; a label
                  moved from its place shows its leader line to its point.
"""

import itertools
import math
import re
import zlib

import numpy as np

# More series than this: the legend stands beside the panels.
MANY_SERIES = 8
# More series than this in one figure: split into panels (`panels`).
MAX_PER_PANEL = 10
PALETTE = 'tab10'
# tab10 by name, three more colours for the attention family's 14, and the
# grey of the references.
TAB = {
  'blue': '#1f77b4',
  'orange': '#ff7f0e',
  'green': '#2ca02c',
  'red': '#d62728',
  'purple': '#9467bd',
  'brown': '#8c564b',
  'pink': '#e377c2',
  'gray': '#7f7f7f',
  'olive': '#bcbd22',
  'cyan': '#17becf',
}
BLACK, TEAL, MUSTARD, NAVY = '#000000', '#00827f', '#e6ab02', '#000080'
LIGHT_GREY = '#999999'
LINESTYLES = ('-', '--', '-.', ':')
MARKERS = ('o', 's', '^', 'D', 'v', 'P', 'X', '*', 'h', 'p', 'd', '<', '>')
ATTENTION, MIXERS, OTHERS = 'attention cores', 'sequence mixers', 'others'

# model: (colour, marker, line style, family). Every model name the
# registry makes (models/attention/registry.py; tests/test_plots_readable.py
# checks that none is missing), the ceiling row of the benchmark, and the
# exact softmax core under its own name. transformer and transformer_fused
# compute the same function: both black, told apart by line and marker.
MODEL_STYLES = {
  'transformer': (BLACK, 'o', '-', ATTENTION),
  'transformer_fused': (BLACK, 's', '--', ATTENTION),
  'softmax': (BLACK, 'o', '-', ATTENTION),
  'local': (TAB['blue'], '^', '-', ATTENTION),
  'sparse_transformer': (TAB['orange'], 'v', '-', ATTENTION),
  'longformer': (TAB['green'], 'D', '-', ATTENTION),
  'bigbird': (TAB['red'], 's', '-', ATTENTION),
  'reformer': (TAB['purple'], 'P', '-', ATTENTION),
  'linformer': (TAB['brown'], 'X', '-', ATTENTION),
  'linear_transformer': (TAB['pink'], '*', '-', ATTENTION),
  'performer': (TAB['gray'], 'h', '-', ATTENTION),
  'sinkhorn': (TAB['olive'], '<', '-', ATTENTION),
  'synthesizer': (TAB['cyan'], '>', '-', ATTENTION),
  'transformer_xl': (TEAL, 'p', '-', ATTENTION),
  'compressive_transformer': (MUSTARD, 'd', '-', ATTENTION),
  'retnet': (NAVY, '8', '-', ATTENTION),
  's4d': (TAB['blue'], 'o', '--', MIXERS),
  's5': (TAB['orange'], 's', '--', MIXERS),
  'mamba': (TAB['green'], '^', '--', MIXERS),
  'mamba2': (TAB['red'], 'v', '--', MIXERS),
  'based': (TAB['purple'], 'D', '--', MIXERS),
  'h3': (TAB['brown'], 'P', '--', MIXERS),
  'hyena': (TAB['pink'], 'X', '--', MIXERS),
  'gla': (TAB['gray'], '*', '--', MIXERS),
  'deltanet': (TAB['olive'], 'h', '--', MIXERS),
  'ceiling': (LIGHT_GREY, '.', ':', OTHERS),
  'none': (LIGHT_GREY, '.', ':', OTHERS),
}
MARKERSIZE = 4.5


def palette():
  """The tab10 colours, as hex strings."""
  return list(TAB.values())


def darker(color, factor=0.7):
  """`color` (an RGB tuple or a colour string) darkened towards black: text
  in a series' colour that stays readable on white."""
  from matplotlib import colors  # pylint: disable=g-import-not-at-top

  return tuple(factor * c for c in colors.to_rgb(color))


def base_model(label, known=MODEL_STYLES):
  """The model a series label names: the label itself, or the longest
  known model it starts with before a space, bracket or parenthesis
  (`transformer [small]`, `gla (bi)`); None for none."""
  if label in known:
    return label
  head = re.split(r'[\s\[(,]', label, maxsplit=1)[0]
  return head if head in known else None


def _hash(text):
  return zlib.crc32(text.encode())


def model_style(model):
  """(colour, marker, line style, family) of a model: MODEL_STYLES's, else
  (a model this table does not list yet) one from its name's CRC-32, dotted
  and in the `others` family: deterministic, never from the figure."""
  if model in MODEL_STYLES:
    return MODEL_STYLES[model]
  h = _hash(model)
  return (
    palette()[h % 10],
    MARKERS[(h // 10) % len(MARKERS)],
    ':',
    OTHERS,
  )


def series_styles(names, marker=None, models=None):
  """{name: {'color', 'marker', 'linestyle', 'markersize'}} for one
  figure's series. A name that is a model (or `models[name]`, the model it
  shows) gets the model's fixed style; any other name that starts with a
  model (a variant, a second run) gets its model's colour with another line
  style or marker; an unknown name a style from its own CRC-32. No two
  names share colour, marker and line style: a name whose look is taken
  (only variants and unknown names can collide) takes the next free
  (line style, marker) of its colour, in a fixed order. `marker` is kept
  for callers of the old signature: every series has its marker now."""
  del marker
  names = list(dict.fromkeys(names))
  models = models or {}
  styles, taken = {}, set()
  exact = []
  for name in names:
    model = models.get(name) or base_model(name)
    if model is not None and name == model:
      exact.append(name)  # fixed looks first: never moved by the others
  order = exact + [n for n in names if n not in exact]
  for name in order:
    model = models.get(name) or base_model(name) or name
    color, mark, line, _ = model_style(model)
    if name != model:  # a variant: its own line style and marker, by hash
      h = _hash(name)
      line = LINESTYLES[h % len(LINESTYLES)]
      mark = MARKERS[(h // len(LINESTYLES)) % len(MARKERS)]
    look = (color, mark, line)
    if look in taken:
      start = _hash(name)
      combos = list(itertools.product(LINESTYLES, MARKERS))
      for k in range(len(combos)):
        line, mark = combos[(start + k) % len(combos)]
        if (color, mark, line) not in taken:
          break
      look = (color, mark, line)
    taken.add(look)
    styles[name] = {
      'color': color,
      'marker': mark,
      'linestyle': line,
      'markersize': MARKERSIZE,
    }
  return {name: styles[name] for name in names}


def family(name, models=None):
  """The family of a series: ATTENTION, MIXERS or OTHERS (by its model)."""
  model = (models or {}).get(name) or base_model(name) or name
  return model_style(model)[3]


def panels(names, models=None, shared=(), most=MAX_PER_PANEL):
  """[(title, names)]: one untitled panel for at most `most` names, else
  a panel per family (ATTENTION, MIXERS, OTHERS), each cut into panels of
  at most `most` in MODEL_STYLES's order (the title numbered then).
  `shared` names (references: the ceiling, the transformer) go in every
  panel and are not counted."""
  names = list(dict.fromkeys(names))
  own = [n for n in names if n not in shared]
  keep = [n for n in names if n in shared]
  if len(own) <= most:
    return [('', names)]
  rank = {m: i for i, m in enumerate(MODEL_STYLES)}

  def key(name):
    model = (models or {}).get(name) or base_model(name) or name
    return (rank.get(model, len(rank)), names.index(name))

  out = []
  for title in (ATTENTION, MIXERS, OTHERS):
    group = sorted((n for n in own if family(n, models) == title), key=key)
    if not group:
      continue
    parts = math.ceil(len(group) / most)
    size = math.ceil(len(group) / parts)
    for k in range(parts):
      chunk = group[k * size : (k + 1) * size]
      label = f'{title} ({k + 1}/{parts})' if parts > 1 else title
      out.append((label, keep + chunk))
  return out


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
