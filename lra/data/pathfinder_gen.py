"""Pathfinder image generator, after the original, vectorised over images.

Linsley et al. 2018, "Learning long-range spatial dependencies with
horizontal gated recurrent units" (arXiv 1805.08315), made Pathfinder with
github.com/drewlinsley/pathfinder (snakes2.py, driven by snakes2_wrapper.py);
LRA's release (Tay et al. 2020, arXiv 2011.04006) ran it with the arguments
noted in lra_benchmarks/data/pathfinder.py. This module is the project's own
implementation of that algorithm: the same sampling steps, tests and
rendering, computed for a whole batch of candidate images at once (one numpy
pass per paddle), so its images follow the original's distribution; the
random stream is ours, so no image is byte-identical to a release image.

Algorithm (coordinates are integer pixels (row, column); 'translate' moves
a point by a distance along an angle and rounds both coordinates UP, as the
original's translate_coord; 'mask' is a float image of the space taken):
  * First paddles: a random whole-degree angle, and a tail drawn
    uniformly from the pixels where that paddle's mask, placed one pixel
    off-centre (the original's dilation kernel), meets no taken pixel
    (mask > 0.3). The original dilates its float64 mask with OpenCV,
    whose border value is then -DBL_MAX; at angles where some pixel's
    kernel lies wholly outside the image the result goes negative and it
    reports no free pixel at all. That depends on the angle alone: at 32
    px only -150..-121 degrees can start a snake (every first paddle points
    up-left), 95 of 360 angles at 64 px, 354-360 at 128 and 256.
  * Target snakes: the mask starts as a border of `padding` px. The first
    tail must fit inside a central square (2 x seed_distance from every
    edge); no free pixel: the image is dropped. The
    second snake's tail is seed_distance away at a random whole-degree
    angle (rounded), unchecked. Each snake then grows alternately: the next
    pivot lies paddle + 2 margin beyond the previous one along the previous
    angle; candidate heads are the distinct pixels on a circle of radius
    paddle + margin around it (one sample per pixel of arc), weighted by
    cos(min(continuity * turn, pi/2))**2 times 1 - (mask dilated by a disc
    of margin px); up to 3 heads are drawn and the first whose paddle mask
    keeps mask + paddle mask below 1.8 everywhere is taken. A paddle's mask
    joins the image's mask only when its snake's next paddle is placed, and
    the first target's last paddle never joins it (as in the original;
    so the second target may end on the first's head: about 0.5% of
    32-px 'easy' images have one head for both, and both labels alike).
    Either target stuck, or a bad draw: the whole image is dropped and
    drawn again (about 96% of candidates at 32 px 'easy', 99.7% 'hard').
  * Distractor snakes: num_distractors = distractor_paddles //
    (contour_length // 3) snakes of contour_length // 3 paddles, one after
    another, each tried up to 5 times and DROPPED when it gets stuck (the
    original's allow_shorter_snakes=False), so few are placed: at 32 px
    about 1.2 of 5 on 'hard', 1.8 of 6 on 'intermediate', 3.4 of 10 on
    'easy' (most tries fail at the first paddle's angle, above). A full
    mask (under 1% of pixels free) stops a snake.
  * Single paddles (clutter): with single_paddles, the original's
    int(150 / ((7.5 + 13 m + 4 m^2) / 123.5)) paddles minus those of the
    snakes, each tried 3 times, until the mask is full. Off for every LRA
    resolution (see the table's notes).

Paddles and markers are drawn by lra/data/pathfinder_draw.py, which also
holds the parameters per resolution (RESOLUTIONS) and their sources.

Determinism: chunk i of a data set draws from numpy's generator seeded with
(seed, i), so the images depend on (seed, index) only, not on the worker
count; the labels change only the markers. The same numpy and CPU give the
same bytes. VERSION names this algorithm in cache names: a cache made by
another version of the generator is never reused.
"""

import numpy as np

from lra.data.pathfinder_draw import (
  COLLIDE,
  RESOLUTIONS,
  VALUE,
  dilate,
  flip,
  markers,
  render,
  tables,
  translate,
)

VERSION = 2
CONTOUR_LENGTHS = {'easy': 6, 'intermediate': 9, 'hard': 14}
HEAD_DRAWS = 3  # max_paddle_retrial 2: 3 draws of a paddle's head
SEED_DRAWS = 3  # ... and of a snake's first paddle
SNAKE_TRIES = 5  # max_distractor_contour_retrial 4
SINGLE_TRIES = 3  # single paddles: max_paddle_retrial 2
TAKEN = 0.3  # a pixel whose mask exceeds this is taken
TAKEN_LEVEL = int(np.nonzero(VALUE <= TAKEN)[0].max())  # levels above: taken
FULL = 0.01  # a snake is not started when under 1% of pixels are free
TAIL_DRAWS = 16  # uniform draws before the exact list of free tails
CHUNK = 1024  # images per chunk: the unit of seeding and of work
MAX_CELLS = 1 << 26  # mask pixels (bytes) of candidates grown at once


# ---------------------------------------------------------------- growing


class _Batch:
  """Masks and paddles of a batch of candidate images of one margin.

  The mask (uint8 levels, see VALUE) carries a border of `pad` zero pixels
  outside the image, so windows near the edge need no test; only in-image
  pixels are written.
  """

  def __init__(self, t, num, mask=None):
    self.t, self.res = t, t.res
    self.pad = _pad(t)
    if mask is None:
      size = self.res + 2 * self.pad
      mask = np.zeros((num, size, size), np.uint8)
      b, lo, hi = t.p.padding, self.pad, self.pad + self.res
      mask[:, lo : lo + b, lo:hi] = mask[:, hi - b : hi, lo:hi] = 255
      mask[:, lo:hi, lo : lo + b] = mask[:, lo:hi, hi - b : hi] = 255
    self.mask = mask
    self.paddles = []  # (y, x, patch, contrast, drawn) arrays [num] each

  def __len__(self):
    return len(self.mask)

  def take(self, index):
    self.mask = self.mask[index]
    self.paddles = [tuple(a[index] for a in q) for q in self.paddles]

  def inside(self, y, x):
    return (y >= 0) & (y < self.res) & (x >= 0) & (x < self.res)

  def _flat(self, y, x, dy, dx):
    """Flat mask indices of pixels (y + dy, x + dx), one image per row."""
    size = self.mask.shape[-1]
    rows = np.arange(len(y))[:, None] * size
    return (
      (rows + y[:, None] + dy + self.pad) * size + x[:, None] + dx + self.pad
    )

  def fits(self, y, x, patch):
    """Rows whose new paddle keeps mask + its mask below COLLIDE (summed in
    float64, as the original's float64 mask). Only the paddle pixels of at
    least COLLIDE - 1 can reach it (the mask is at most 1; outside the
    image it is 0 here, as the original leaves those pixels out)."""
    dy, dx, v = (a[patch] for a in self.t.hot)
    total = VALUE[self.mask.reshape(-1)[self._flat(y, x, dy, dx)]] + v
    return ~(total >= COLLIDE).any(1)

  def commit(self, y, x, patch, rows):
    """The paddle masks of `rows` join the image's mask (maximum), inside
    the image only."""
    dy, dx, v = (a[patch] for a in self.t.ink)
    py, px = y[:, None] + dy, x[:, None] + dx
    keep = (py >= 0) & (py < self.res) & (px >= 0) & (px < self.res)
    flat = self._flat(y, x, dy, dx)
    m = self.mask.reshape(-1)
    m[flat] = np.maximum(m[flat], np.where(keep & rows[:, None], v, 0))

  def draw(self, y, x, patch, contrast, rows):
    self.paddles.append((y, x, patch, np.full(len(y), contrast), rows))

  def free_fraction(self):
    """Per image, the fraction of pixels not taken (mask <= TAKEN)."""
    inner = self.mask[:, self.pad : -self.pad, self.pad : -self.pad]
    return (inner <= TAKEN_LEVEL).mean((1, 2))

  def free_tails(self, rng, deg, index):
    """(y, x, found) [n]: per image of `index`, a uniform draw among the
    pixels where a first paddle at angle index deg [n] fits (the original's
    seed_snake): first TAIL_DRAWS uniform draws, then the exact list."""
    n, res, pad = len(index), self.res, self.pad
    sdy, sdx, valid = (a[deg] for a in self.t.seed_struct)
    taken = self.mask[index] > TAKEN_LEVEL
    size = taken.shape[-1]
    y = rng.integers(0, res, (n, TAIL_DRAWS))
    x = rng.integers(0, res, (n, TAIL_DRAWS))
    rows = np.arange(n)[:, None, None] * size * size
    flat = rows + (y[..., None] + sdy[:, None] + pad) * size
    flat = flat + x[..., None] + sdx[:, None] + pad
    free = ~(taken.reshape(-1)[flat] & valid[:, None]).any(-1)
    free &= self.t.seed_ok[deg][:, None]
    found = free.any(1)
    first = free.argmax(1)
    ty, tx = y[np.arange(n), first], x[np.arange(n), first]
    for i in np.nonzero(~found & self.t.seed_ok[deg])[0]:  # rare: list all
      v = valid[i]
      blocked = dilate(taken[i, pad:-pad, pad:-pad], sdy[i][v], sdx[i][v])
      ok = np.flatnonzero(~blocked)
      if len(ok):
        c = ok[rng.integers(0, len(ok))]
        ty[i], tx[i], found[i] = c // res, c % res, True
    return ty, tx, found


class _Snakes:
  """One growing snake per row: its tail, its pending paddle (start (y, x)
  and patch; its mask joins the image's mask when the next paddle is
  placed), its pivot and angle."""

  KEYS = ('ty', 'tx', 'y', 'x', 'patch', 'py', 'px', 'theta')

  def __init__(self, **arrays):
    self.__dict__.update(arrays)

  def take(self, index):
    for k in self.KEYS:
      setattr(self, k, getattr(self, k)[index])


def _extend(rng, bt, s, contrast):
  """Places each row's next paddle of snakes s; returns the rows where it
  fitted (the original's extend_snake)."""
  t = bt.t
  cdy, cdx, angle, cpatch = t.cand
  n = len(bt)
  py, px = translate(s.py, s.px, s.theta, t.p.paddle_length + 2 * t.margin)
  hy, hx = py[:, None] + cdy, px[:, None] + cdx  # [n, K] candidate heads
  inside = bt.inside(hy, hx)
  hy, hx = np.where(inside, hy, 0), np.where(inside, hx, 0)
  sdy, sdx = t.small
  size = bt.mask.shape[-1]
  base = (np.arange(n)[:, None] * size + hy + bt.pad) * size + hx + bt.pad
  near = bt.mask.reshape(-1)[base[..., None] + (sdy * size + sdx)].max(-1)
  turn = np.abs(angle - s.theta[:, None])
  turn = np.minimum(turn, 2 * np.pi - turn)
  weight = np.maximum(np.cos(np.minimum(turn * t.p.continuity, np.pi / 2)), 0)
  pmf = np.where(inside, (1 - VALUE[near]) * weight**2, 0.0)
  total = pmf.sum(1)
  alive = total >= 1e-4
  cmf = np.cumsum(pmf, 1) / np.where(alive, total, 1.0)[:, None]
  draws = rng.random((n, HEAD_DRAWS))
  pick = (cmf[:, None, :] - draws[:, :, None] > 0).argmax(-1)  # [n, D]
  r = np.arange(n)
  ok = (
    np.stack([bt.fits(hy[r, k], hx[r, k], cpatch[k]) for k in pick.T], 1)
    & alive[:, None]
  )
  found = ok.any(1)
  k = pick[r, ok.argmax(1)]
  bt.commit(s.y, s.x, s.patch, found)  # the previous paddle's mask
  s.y = np.where(found, hy[r, k], s.y)
  s.x = np.where(found, hx[r, k], s.x)
  s.patch = np.where(found, cpatch[k], s.patch)
  bt.draw(s.y, s.x, s.patch, contrast, found)
  s.py, s.px = np.where(found, py, s.py), np.where(found, px, s.px)
  s.theta = np.where(found, angle[k], s.theta)
  return found


def _degrees(rng, n):
  """Whole-degree angles as the original: (index 0..359, radians)."""
  deg = rng.integers(0, 360, n)
  return deg, (deg - 180) * np.pi / 180


def _seeds(rng, t, num):
  """The two targets' first paddles for `num` candidates (the original's
  initialize_two_seeds). Returns (keep [num], snakes 0 and 1)."""
  p, res = t.p, t.res
  length, step = p.paddle_length, p.paddle_length + t.margin
  counts = np.array([len(a) for a in t.first_tails])
  table = np.zeros((360, max(counts.max(), 1)), np.int64)
  for i, a in enumerate(t.first_tails):
    table[i, : len(a)] = a
  out = [np.zeros(num, np.int64) for _ in range(8)]
  theta = [np.zeros(num), np.zeros(num)]
  todo, keep = np.ones(num, bool), np.zeros(num, bool)
  for _ in range(SEED_DRAWS):  # a bad draw is tried again, a full mask not
    i = np.nonzero(todo)[0]
    deg, th = _degrees(rng, len(i))
    c = counts[deg]
    todo[i[c == 0]] = False
    cell = table[deg, (rng.random(len(i)) * np.maximum(c, 1)).astype(int)]
    ty, tx = cell // res, cell % res
    hy, hx = translate(ty, tx, th, length)
    vy, vx = translate(hy, hx, flip(th), step)
    good = (c > 0) & _inside(res, hy, hx) & _inside(res, vy, vx)
    for a, v in zip(out[:4], (ty, tx, vy, vx)):
      a[i[good]] = v[good]
    theta[0][i[good]] = th[good]
    keep[i[good]], todo[i[good]] = True, False
  todo, second = keep.copy(), np.zeros(num, bool)
  for _ in range(SEED_DRAWS):
    i = np.nonzero(todo)[0]
    _, th = _degrees(rng, len(i))
    phi = rng.integers(0, 360, len(i)) * np.pi / 180
    ty = np.round(out[0][i] + p.seed_distance * np.sin(phi)).astype(np.int64)
    tx = np.round(out[1][i] + p.seed_distance * np.cos(phi)).astype(np.int64)
    hy, hx = translate(ty, tx, th, length)
    vy, vx = translate(hy, hx, flip(th), step)
    good = _inside(res, hy, hx) & _inside(res, vy, vx)
    for a, v in zip(out[4:], (ty, tx, vy, vx)):
      a[i[good]] = v[good]
    theta[1][i[good]] = th[good]
    second[i[good]], todo[i[good]] = True, False
  keep &= second
  snakes = [
    _Snakes(
      ty=out[4 * s],
      tx=out[4 * s + 1],
      y=out[4 * s].copy(),
      x=out[4 * s + 1].copy(),
      patch=t.patch(theta[s]),
      py=out[4 * s + 2],
      px=out[4 * s + 3],
      theta=theta[s],
    )
    for s in range(2)
  ]
  return keep, snakes


def _inside(res, y, x):
  return (y >= 0) & (y < res) & (x >= 0) & (x < res)


def _pad(t):
  """Mask border (px) that every window of a paddle, a candidate head's
  disc or a first paddle's kernel stays within."""
  return max(t.half, t.p.paddle_length + t.margin + 1) + 1


def _targets(rng, t, num, length, cap):
  """Grows two target snakes in `num` candidates (at most `cap` of them
  past the first paddles); returns (batch, snakes) of those that completed
  (the original's two_snakes, retried)."""
  keep, snakes = _seeds(rng, t, num)
  index = np.nonzero(keep)[0][:cap]
  for s in snakes:
    s.take(index)
  bt = _Batch(t, len(index))
  for s in snakes:
    bt.draw(s.y, s.x, s.patch, t.p.target_contrast, np.ones(len(bt), bool))
  alive = np.ones(len(bt), bool)
  for _ in range(length - 1):
    for s in snakes:
      if alive.mean() < 0.7:  # drop the dead, so work goes to the living
        index = np.nonzero(alive)[0]
        bt.take(index)
        for x in snakes:
          x.take(index)
        alive = alive[index]
      if not len(bt):
        return bt, snakes
      alive &= _extend(rng, bt, s, t.p.target_contrast)
  index = np.nonzero(alive)[0]
  bt.take(index)
  for s in snakes:
    s.take(index)
  # Only the second target's last paddle joins the mask (as the original).
  b = snakes[1]
  bt.commit(b.y, b.x, b.patch, np.ones(len(bt), bool))
  return bt, snakes


def _snake(rng, bt, length, contrast):
  """One short snake in each image of bt (the original's make_snake).
  Returns which images got it whole; the others must be discarded."""
  t, n = bt.t, len(bt)
  todo = bt.free_fraction() >= FULL
  ok = np.zeros(n, bool)
  arrays = {k: np.zeros(n, np.int64) for k in _Snakes.KEYS}
  arrays['theta'] = np.zeros(n)
  for _ in range(SEED_DRAWS):
    i = np.nonzero(todo)[0]
    if not len(i):
      break
    deg, th = _degrees(rng, len(i))
    ty, tx, found = bt.free_tails(rng, deg, i)
    todo[i[~found]] = False  # no free pixel: the snake is not started
    hy, hx = translate(ty, tx, th, t.p.paddle_length)
    vy, vx = translate(hy, hx, flip(th), t.p.paddle_length + t.margin)
    good = found & bt.inside(hy, hx) & bt.inside(vy, vx)
    for k, v in zip(('ty', 'tx', 'py', 'px', 'theta'), (ty, tx, vy, vx, th)):
      arrays[k][i[good]] = v[good]
    ok[i[good]] = True
    todo[i[good]] = False
  s = _Snakes(**arrays)
  s.y, s.x, s.patch = s.ty.copy(), s.tx.copy(), t.patch(s.theta)
  bt.draw(s.y, s.x, s.patch, contrast, ok)
  for _ in range(length - 1):
    ok &= _extend(rng, bt, s, contrast)
  bt.commit(s.y, s.x, s.patch, ok)
  return ok


def _many(rng, bt, count, length, tries, contrast):
  """count snakes of `length` paddles per image, one after another, each
  tried `tries` times, else skipped (make_many_snakes with
  allow_incomplete). Returns the snakes placed per image."""
  placed = np.zeros(len(bt), np.int64)
  for _ in range(count):
    todo = np.arange(len(bt))
    for _ in range(tries):
      if not len(todo):
        break
      sub = _Batch(bt.t, len(todo), bt.mask[todo])
      ok = _snake(rng, sub, length, contrast)
      done = todo[ok]
      bt.mask[done] = sub.mask[ok]
      for q in sub.paddles:
        full = [np.zeros(len(bt), a.dtype) for a in q]
        for a, v in zip(full, q):
          a[done] = v[ok]
        bt.paddles.append(tuple(full))
      placed[done] += 1
      todo = todo[~ok]
  return placed


# Measured (fraction of grown candidates whose two targets complete, fraction
# of candidates whose first paddles fit); they size the candidate batches.
# Like every constant here they are part of the generator's definition:
# changing them changes the images (not their distribution).
SUCCESS = {
  (32, 6): (0.54, 0.083),
  (32, 9): (0.19, 0.083),
  (32, 14): (0.045, 0.083),
  (64, 6): (0.33, 0.26),
  (64, 9): (0.017, 0.26),
  (64, 14): (0.0008, 0.26),
  (128, 6): (0.57, 0.99),
  (128, 9): (0.13, 0.99),
  (128, 14): (0.0028, 0.99),
}


def _grow(rng, t, num, length):
  """The geometry of `num` images of one margin (see grow)."""
  p = t.p
  cap = max(64, MAX_CELLS // (t.res + 2 * _pad(t)) ** 2)
  rate, seeded = SUCCESS.get((t.res, length), (0.01, 1.0))
  parts, have = [], 0
  while have < num:
    grown = min(cap, max(64, 1.3 * (num - have) / rate))
    attempts = int(grown / seeded)  # candidates whose first paddles fit
    bt, snakes = _targets(rng, t, attempts, length, cap)
    if not len(bt):
      continue
    index = np.arange(min(len(bt), num - have))
    bt.take(index)
    for s in snakes:
      s.take(index)
    dl = length // 3
    nd = p.distractor_paddles // dl if dl else 0
    placed = _many(rng, bt, nd, dl, SNAKE_TRIES, p.distractor_contrast)
    singles = 0
    if p.single_paddles:
      total = int(150 / ((7.5 + 13 * t.margin + 4 * t.margin**2) / 123.5))
      singles = _many(
        rng,
        bt,
        total - 2 * length - nd * dl,
        1,
        SINGLE_TRIES,
        p.distractor_contrast,
      )
    parts.append(
      dict(
        paddles=np.stack([np.stack(q, 1) for q in bt.paddles], 1),
        tails=np.stack([[s.ty, s.tx] for s in snakes], 0).transpose(2, 0, 1),
        heads=np.stack([[s.y, s.x] for s in snakes], 0).transpose(2, 0, 1),
        distractors=placed,
        singles=np.broadcast_to(singles, placed.shape).copy(),
      )
    )
    have += len(index)
  return parts


def _compact(paddles):
  """[n, P, 5] paddle records -> [n, P', 5], the drawn ones first."""
  order = np.argsort(paddles[..., 4] == 0, axis=1, kind='stable')
  paddles = np.take_along_axis(paddles, order[..., None], 1)
  return paddles[:, : max(1, int(paddles[..., 4].sum(1).max()))]


def _concat_paddles(arrays):
  width = max(a.shape[1] for a in arrays)
  return np.concatenate(
    [np.pad(a, ((0, 0), (0, width - a.shape[1]), (0, 0))) for a in arrays]
  )


def grow(rng, num, res, contour_length):
  """Geometry of `num` images.

  Returns dict(paddles [B, P, 5] (row, column, table patch, contrast,
  drawn), margin [B], tails and heads [B, 2, 2] (row, column) of the two
  targets, origin [B] (the target whose tail gets a marker), distractors
  [B] (distractor snakes placed), singles [B] (single paddles placed)).
  """
  p = RESOLUTIONS[res]
  margin = np.asarray(p.margins)[rng.integers(0, len(p.margins), num)]
  out = dict(
    margin=margin,
    tails=np.zeros((num, 2, 2), np.int64),
    heads=np.zeros((num, 2, 2), np.int64),
    distractors=np.zeros(num, np.int64),
    singles=np.zeros(num, np.int64),
  )
  groups = []
  for m in p.margins:
    index = np.nonzero(margin == m)[0]
    if not len(index):
      continue
    parts = _grow(rng, tables(res, m), len(index), contour_length)
    for k in ('tails', 'heads', 'distractors', 'singles'):
      out[k][index] = np.concatenate([x[k] for x in parts])
    paddles = _concat_paddles([_compact(x['paddles']) for x in parts])
    groups.append((index, paddles))
  width = max(a.shape[1] for _, a in groups)
  out['paddles'] = np.zeros((num, width, 5))
  for index, paddles in groups:
    out['paddles'][index, : paddles.shape[1]] = paddles
  out['origin'] = rng.integers(0, 2, num)
  return out


def chunk_geometry(num, res, contour_length, seed, index):
  """The snakes of chunk `index`: `grow` on the stream (seed, index)."""
  return grow(np.random.default_rng([seed, index]), num, res, contour_length)


def generate_chunk(labels, res, contour_length, seed, index):
  """Images uint8 [len(labels), res * res] of chunk `index` of a data set.

  The random stream depends on (seed, index) only, never on the labels.
  """
  num = len(labels)
  geom = chunk_geometry(num, res, contour_length, seed, index)
  return render(geom, markers(geom, labels), res).reshape(num, res * res)
