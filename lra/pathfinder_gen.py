"""Pathfinder image generator: dashed 'paddle' snakes, vectorised over images.

After Linsley et al. 2018, "Learning long-range spatial dependencies with
horizontal gated recurrent units" (arXiv 1805.08315), whose generator
(github.com/drewlinsley/pathfinder) made the LRA release. This is the
project's own implementation of the same recipe, written for speed: every
snake of a batch of images grows in lock-step, one numpy pass per paddle.

Recipe (lengths in pixels of the output image; x = column, y = row):
  * A snake is a chain of paddles, straight dashes of `paddle_length`. The
    next paddle starts 2 * margin beyond the previous one's head, turned by
    an angle d drawn with weight cos(continuity * d)**2 on
    |d| < pi / (2 * continuity) (the original's continuity weighting: a
    higher continuity gives smoother snakes). NUM_TURNS turns, stratified
    over that range, are tested, and the weighted draw is among those that
    fit.
  * A paddle fits when its centre line stays margin + thickness away from
    every paddle already drawn (so the ink of different dashes stays about
    `margin` apart; an occupancy grid per image, cells of `cell` px) and 1
    px of padding inside the image.
  * Two target snakes of contour_length paddles start seed_distance apart
    near the centre (the first tail at least 2 * seed_distance from every
    edge) and grow alternately. An image is dropped (and another one drawn)
    when a target gets stuck, or when a target's end, where a marker may go,
    comes within marker_radius + margin of the other target: such a marker
    would join the two snakes. Long snakes in small images get stuck often
    (about 4% of 32-px 'hard' candidates survive, 1% at 128 px), so
    candidates are grown in batches and the dead ones dropped early.
  * Distractors: distractor_paddles // (contour_length // 3) short snakes
    of contour_length // 3 paddles, started at free random places; a stuck
    distractor simply stays shorter. Discs around the four target ends are
    kept free of them, so no distractor touches a marker.
  * Two markers (discs of marker_radius): one on the tail of a randomly
    chosen target, one on the far end (head) of the same target (label 1)
    or of the other target (label 0). The label decides nothing else, so
    one seed gives the same snakes for both labels.
  * Rendering: each dash is a capsule of width max(thickness, 1 px) at
    brightness `contrast`, each marker a disc at full brightness, both
    antialiased (pixel coverage approximated by a 1-pixel ramp across the
    edge); background 0; uint8 0..255. (The release drew its 0.5-px dashes
    at 2x scale with contrast 2 x 0.75, also to keep them visible.)

Parameters per resolution (RESOLUTIONS below):

  res  paddle thick margin marker seed  contin. distractor  contrast
                                   dist         paddles
  32     2    0.5    1      1.5    7     1.0       20         1.0
  64     3    1.0    1      2.2   12     1.4       27         1.0
  128    5    1.5   2|3     3     20     1.8       35         0.9
  256    8    2.0    4      4.2   40     2.2       64         1.0

32 and 128 are the LRA release settings (pathfinder32 and Path-X; 128 draws
the margin 2 or 3 per image, as it did); 64 is interpolated; 256 follows a
later 256-px Pathfinder generator (its paddle, thickness, margin, marker and
continuity; seed distance and distractor count ours). Contour lengths:
easy 6, intermediate 9, hard 14 paddles per target snake.

Determinism: chunk i of a data set draws from numpy's generator seeded with
(seed, i), so the images depend on (seed, index) only, not on the worker
count; the label array is an input and changes only the markers. The same
numpy and CPU give the same bytes (float rounding may differ elsewhere).
"""

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class Params:
  """Snake geometry of one resolution (lengths in output pixels)."""

  paddle_length: float
  thickness: float
  margins: tuple  # one is drawn per image
  marker_radius: float
  seed_distance: float
  continuity: float
  distractor_paddles: int  # paddles of all distractors together
  contrast: float  # dash brightness (markers are 1.0)
  padding: float = 1.0  # centre lines stay this far inside the image
  cell: float = 1.0  # occupancy grid cell (px) of the collision test


RESOLUTIONS = {
  32: Params(2, 0.5, (1,), 1.5, 7, 1.0, 20, 1.0, cell=0.5),
  64: Params(3, 1.0, (1,), 2.2, 12, 1.4, 27, 1.0, cell=0.5),
  128: Params(5, 1.5, (2, 3), 3.0, 20, 1.8, 35, 0.9),
  256: Params(8, 2.0, (4,), 4.2, 40, 2.2, 64, 1.0),
}
CONTOUR_LENGTHS = {'easy': 6, 'intermediate': 9, 'hard': 14}
NUM_TURNS = 12  # candidate turns per paddle (stratified over the range)
NUM_PLACES = 24  # candidate places per snake start
MAX_ATTEMPTS = 2048  # candidates grown at once (small batches stay in cache)
CHUNK = 1024  # images per chunk: the unit of seeding and of work


def _unit(theta):
  return np.stack([np.cos(theta), np.sin(theta)], -1)


def _samples(start, end, num):
  """Points along segments: [..., 2] x2 -> [..., num, 2]."""
  f = np.linspace(0.0, 1.0, num, dtype=np.float32)[:, None]
  return start[..., None, :] + f * (end - start)[..., None, :]


def _segment_distance(p, a, b):
  """Distance of points p [..., 2] to segments a-b (broadcast)."""
  px, py, ax, ay = p[..., 0], p[..., 1], a[..., 0], a[..., 1]
  abx, aby = b[..., 0] - ax, b[..., 1] - ay
  apx, apy = px - ax, py - ay
  den = np.maximum(abx * abx + aby * aby, 1e-9)
  t = np.clip((apx * abx + apy * aby) / den, 0.0, 1.0)
  dx, dy = apx - t * abx, apy - t * aby
  return np.sqrt(dx * dx + dy * dy)


def _box(a, b, reach, step, width):
  """Grid points [n, W, W, 2] of a square around each segment's middle."""
  grid = np.arange(width, dtype=np.float32) * step
  lo = np.floor(((a + b) / 2 - reach) / step) * step  # [n, 2]
  gx = lo[:, None, None, 0] + grid[None, None, :]
  gy = lo[:, None, None, 1] + grid[None, :, None]
  return np.stack(np.broadcast_arrays(gx, gy), -1)


class _Canvas:
  """Occupancy grids of a batch of images and the collision test.

  A cell is occupied when its centre lies within `clear` (margin +
  thickness) of a committed centre line; a candidate fits when none of the
  points sampled along it (every half pixel) falls in an occupied cell. The
  grids have a border of `pad` cells, so writes near the edge need no test.
  """

  def __init__(self, rng, num, res, p):
    self.p, self.res = p, res
    margins = np.asarray(p.margins, np.float32)
    self.margin = margins[rng.integers(0, len(margins), num)]
    self.pad = (
      int(np.ceil((p.marker_radius + max(margins) + p.thickness) / p.cell)) + 2
    )
    self.size = int(round(res / p.cell)) + 2 * self.pad
    self.occ = np.zeros((num, self.size, self.size), bool)
    self.num_samples = int(np.ceil(p.paddle_length / p.cell)) + 1
    self.lo, self.hi = p.padding, res - 1 - p.padding

  @property
  def clear(self):
    return self.margin + self.p.thickness

  @property
  def rows(self):
    return np.arange(len(self.occ))

  def take(self, index):
    self.occ, self.margin = self.occ[index], self.margin[index]

  def _cell(self, x):
    c = np.floor((x + 0.5) / self.p.cell).astype(np.int32) + self.pad
    return np.clip(c, 0, self.size - 1)

  def free(self, start, end, other=None):
    """Which candidate paddles [B, T] fit (in bounds, no ink nearby)."""
    lo = np.minimum(start, end)  # a segment is convex: test its ends
    hi = np.maximum(start, end)
    ok = (lo[..., 0] >= self.lo) & (lo[..., 1] >= self.lo)
    ok &= (hi[..., 0] <= self.hi) & (hi[..., 1] <= self.hi)
    pts = _samples(start, end, self.num_samples)  # [B, T, P, 2]
    cx, cy = self._cell(pts[..., 0]), self._cell(pts[..., 1])
    flat = (self.rows[:, None, None] * self.size + cy) * self.size + cx
    ok &= ~self.occ.reshape(-1)[flat].any(-1)
    if other is not None:  # the other target's newest, uncommitted paddle
      a, b = (x[:, None, None, :] for x in other)
      d = _segment_distance(pts, a, b).min(-1)
      ok &= d >= self.clear[:, None]
    return ok

  def commit(self, start, end, active, radius=None):
    """Occupies the cells within `radius` (default clear) of segments."""
    radius = self.clear if radius is None else radius
    rows = np.nonzero(active)[0]
    if not len(rows):
      return
    a, b, r = start[rows], end[rows], radius[rows]
    cell = self.p.cell
    reach = float(np.abs(b - a).max() / 2 + r.max())
    width = int(np.ceil(2 * reach / cell)) + 1
    lo = np.floor(((a + b) / 2 - reach + 0.5) / cell).astype(np.int32)
    k = np.arange(width, dtype=np.int32)
    cx = lo[:, 0, None] + k  # [n, W] cell indices
    cy = lo[:, 1, None] + k
    # Squared distance of the cell centres to each segment, [n, W, W].
    px = ((cx + 0.5) * cell - 0.5 - a[:, :1])[:, None, :]
    py = ((cy + 0.5) * cell - 0.5 - a[:, 1:])[:, :, None]
    abx, aby = (b - a)[:, 0, None, None], (b - a)[:, 1, None, None]
    den = np.maximum(abx * abx + aby * aby, 1e-9)
    t = np.clip((px * abx + py * aby) / den, 0.0, 1.0)
    dx, dy = px - t * abx, py - t * aby
    keep = dx * dx + dy * dy <= (r * r)[:, None, None]
    base = rows * self.size + self.pad
    flat = (
      (base[:, None] + cy)[:, :, None] * self.size + self.pad + cx[:, None, :]
    )
    self.occ.reshape(-1)[flat[keep]] = True


def _turns(rng, num, continuity):
  """NUM_TURNS stratified turns [B, T] over |d| < pi / (2 * continuity)."""
  strata = (np.arange(NUM_TURNS) + rng.random((num, NUM_TURNS))) / NUM_TURNS
  return ((strata - 0.5) * np.pi / continuity).astype(np.float32)


def _pick(rng, ok, turns=None, continuity=1.0):
  """(index [B], found [B]): a fitting candidate, drawn with probability
  ~ cos(continuity * turn)**2 (uniform without turns)."""
  score = -np.log(-np.log(rng.random(ok.shape) + 1e-12) + 1e-12)  # Gumbel
  if turns is not None:
    score += 2 * np.log(np.cos(continuity * turns) + 1e-6)
  return np.where(ok, score, -np.inf).argmax(1), ok.any(1)


class _Snake:
  """One growing snake per image: its newest (pending) paddle and heading.

  The pending paddle is committed to the grid only when the next one is
  placed, so a paddle is never tested against its own predecessor.
  """

  def __init__(self, start, end, theta, active):
    self.start, self.end, self.theta, self.active = start, end, theta, active
    self.tail = start

  def take(self, index):
    for k in ('start', 'end', 'theta', 'active', 'tail'):
      setattr(self, k, getattr(self, k)[index])

  def segment(self):
    return np.concatenate([self.start, self.end], -1)

  def extend(self, rng, cv, p, other=None):
    """Places the next paddle; returns the images where it fitted."""
    turn = _turns(rng, len(self.theta), p.continuity)
    theta = self.theta[:, None] + turn
    pivot = self.end + cv.margin[:, None] * _unit(self.theta)
    start = pivot[:, None, :] + cv.margin[:, None, None] * _unit(theta)
    end = start + p.paddle_length * _unit(theta)
    ok = cv.free(start, end, other and (other.start, other.end))
    index, found = _pick(rng, ok, turn, p.continuity)
    cv.commit(self.start, self.end, self.active)
    rows = cv.rows
    keep = self.active & found
    self.start = np.where(keep[:, None], start[rows, index], self.start)
    self.end = np.where(keep[:, None], end[rows, index], self.end)
    self.theta = np.where(keep, theta[rows, index], self.theta)
    self.active = keep
    return keep


def _first(rng, cv, p, xy, theta, other=None):
  """A snake on the first fitting of candidate first paddles [B, T]."""
  end = xy + p.paddle_length * _unit(theta)
  index, found = _pick(rng, cv.free(xy, end, other))
  rows = cv.rows
  return _Snake(xy[rows, index], end[rows, index], theta[rows, index], found)


def _targets(rng, num, res, p, length):
  """Grows two target snakes in `num` images; keeps those that complete.

  Returns (canvas, segments [n, 2 * length, 4], tails, heads [n, 2, 2]),
  or None when no image survives. Images are dropped as soon as a target
  gets stuck, so most of the work goes to images that survive.
  """
  cv = _Canvas(rng, num, res, p)
  sd = p.seed_distance
  lo, hi = 2 * sd, res - 2 * sd
  tail = (lo + rng.random((num, 1, 2)) * (hi - lo)).astype(np.float32)
  angle = rng.uniform(-np.pi, np.pi, (num, 1)).astype(np.float32)
  snakes = [_first(rng, cv, p, tail, angle)]
  phi = rng.uniform(-np.pi, np.pi, (num, NUM_PLACES)).astype(np.float32)
  angle = rng.uniform(-np.pi, np.pi, (num, NUM_PLACES)).astype(np.float32)
  a = snakes[0]
  snakes.append(
    _first(rng, cv, p, tail + sd * _unit(phi), angle, (a.start, a.end))
  )
  segs = [s.segment() for s in snakes]
  alive = snakes[0].active & snakes[1].active
  for k in range(1, length):
    for s, snake in enumerate(snakes):
      if not alive.any():
        return None
      if alive.mean() < 0.8:  # drop the dead images
        index = np.nonzero(alive)[0]
        cv.take(index)
        for x in snakes:
          x.take(index)
        segs = [x[index] for x in segs]
        alive = alive[index]
      alive &= snake.extend(rng, cv, p, snakes[1 - s])
      segs.append(snake.segment())
  segs = np.stack(segs, 1)
  tails = np.stack([s.tail for s in snakes], 1)
  heads = np.stack([s.end for s in snakes], 1)
  # A marker must not touch the other target: it would join the two.
  far = p.marker_radius + cv.margin
  for s in range(2):
    other = segs[:, 1 - s :: 2]  # [B, length, 4]
    for ends in (tails, heads):
      d = _segment_distance(
        ends[:, s, None], other[..., :2], other[..., 2:]
      ).min(-1)
      alive &= d >= far
  index = np.nonzero(alive)[0]
  cv.take(index)
  segs, tails, heads = segs[index], tails[index], heads[index]
  for snake in snakes:
    snake.take(index)
    cv.commit(snake.start, snake.end, snake.active)
  reserve = p.marker_radius + cv.clear
  for ends in (tails, heads):
    for s in range(2):
      cv.commit(ends[:, s], ends[:, s], snakes[s].active, reserve)
  return cv, segs, tails, heads


def _distractors(rng, cv, p, length):
  """Grows the short distractors, one after another: segs [B, S, 4], ok."""
  num = len(cv.occ)
  count = p.distractor_paddles // length if length else 0
  segs, oks = [], []
  for _ in range(count):
    xy = rng.uniform(cv.lo, cv.hi, (num, NUM_PLACES, 2)).astype(np.float32)
    angle = rng.uniform(-np.pi, np.pi, (num, NUM_PLACES)).astype(np.float32)
    snake = _first(rng, cv, p, xy, angle)
    segs.append(snake.segment())
    oks.append(snake.active)
    for _ in range(1, length):
      oks.append(snake.extend(rng, cv, p))
      segs.append(snake.segment())
    cv.commit(snake.start, snake.end, snake.active)
  if not segs:
    return np.zeros((num, 0, 4), np.float32), np.zeros((num, 0), bool)
  return np.stack(segs, 1), np.stack(oks, 1)


def grow(rng, num, res, contour_length, attempts):
  """Geometry of `num` images, from candidate batches of `attempts`.

  Returns dict(segs [B, S, 4] (x0, y0, x1, y1), seg_ok [B, S], tails and
  heads [B, 2, 2] of the two targets, origin [B]: the target whose tail
  gets a marker).
  """
  p = RESOLUTIONS[res]
  parts, have = [], 0
  while have < num:
    found = _targets(rng, attempts, res, p, contour_length)
    if found is None or not len(found[1]):
      continue
    cv, segs, tails, heads = found
    index = np.arange(min(len(segs), num - have))
    cv.take(index)
    dsegs, dok = _distractors(rng, cv, p, contour_length // 3)
    n = len(index)
    parts.append(
      dict(
        segs=np.concatenate([segs[index], dsegs], 1),
        seg_ok=np.concatenate([np.ones(segs[index].shape[:2], bool), dok], 1),
        tails=tails[index],
        heads=heads[index],
        origin=rng.integers(0, 2, n),
      )
    )
    have += n
  return {k: np.concatenate([x[k] for x in parts]) for k in parts[0]}


def _splat(img, rows, a, b, half_width, value, res):
  """Max-blends antialiased capsules (segment a-b; a disc where a == b).

  img: float32 [B * res * res]. Intensity is `value` times the coverage of
  a pixel by the capsule of half_width, approximated by a 1-pixel linear
  ramp centred on its edge.
  """
  reach = float(np.abs(b - a).max(initial=0) / 2)
  reach += half_width + 0.5
  width = int(np.ceil(2 * reach)) + 2
  block = max(1, (1 << 21) // (width * width))
  for i in range(0, len(rows), block):
    sa, sb, r = a[i : i + block], b[i : i + block], rows[i : i + block]
    pts = _box(sa, sb, reach, 1.0, width)  # pixel centres
    dist = _segment_distance(pts, sa[:, None, None], sb[:, None, None])
    val = np.clip(half_width + 0.5 - dist, 0.0, 1.0) * np.float32(value)
    ix = pts.astype(np.int64)
    inside = ((ix >= 0) & (ix < res)).all(-1) & (val > 0)
    flat = (r[:, None, None] * res + ix[..., 1]) * res + ix[..., 0]
    np.maximum.at(img, flat[inside], val[inside])


def render(geom, ends, res):
  """Images uint8 [B, res, res]: the snakes of geom plus markers [B, 2, 2]."""
  p = RESOLUTIONS[res]
  num = len(ends)
  img = np.zeros(num * res * res, np.float32)
  rows, slot = np.nonzero(geom['seg_ok'])
  seg = geom['segs'][rows, slot]
  half = max(p.thickness, 1.0) / 2  # thinner dashes: 1 px, fainter ends
  _splat(img, rows, seg[:, :2], seg[:, 2:], half, p.contrast, res)
  m = ends.reshape(-1, 2).astype(np.float32)
  rows = np.repeat(np.arange(num), 2)
  _splat(img, rows, m, m, p.marker_radius, 1.0, res)
  img = np.round(img * 255).astype(np.uint8)
  return img.reshape(num, res, res)


def markers(geom, labels):
  """[B, 2, 2]: the origin target's tail, and the head of the same target
  (label 1) or of the other one (label 0)."""
  rows, origin = np.arange(len(labels)), geom['origin']
  far = np.where(np.asarray(labels) == 1, origin, 1 - origin)
  return np.stack([geom['tails'][rows, origin], geom['heads'][rows, far]], 1)


def _attempts(res, contour_length, num):
  """Candidates per batch: ~1.3x what the usual success rate needs."""
  rate = SUCCESS.get((res, contour_length), 0.05)
  return int(min(MAX_ATTEMPTS, max(64, 1.3 * num / rate)))


# Measured fraction of candidates whose two targets complete; it sizes the
# candidate batches. Like every constant here it is part of the generator's
# definition: changing it changes the images (not their distribution).
SUCCESS = {
  (32, 6): 0.41,
  (32, 9): 0.18,
  (32, 14): 0.039,
  (64, 6): 0.63,
  (64, 9): 0.28,
  (64, 14): 0.067,
  (128, 6): 0.53,
  (128, 9): 0.15,
  (128, 14): 0.011,
  (256, 6): 0.66,
  (256, 9): 0.30,
  (256, 14): 0.018,
}


def chunk_geometry(num, res, contour_length, seed, index):
  """The snakes of chunk `index`: `grow` on the stream (seed, index)."""
  rng = np.random.default_rng([seed, index])
  attempts = _attempts(res, contour_length, num)
  return grow(rng, num, res, contour_length, attempts)


def generate_chunk(labels, res, contour_length, seed, index):
  """Images uint8 [len(labels), res * res] of chunk `index` of a data set.

  The random stream depends on (seed, index) only, never on the labels.
  """
  num = len(labels)
  geom = chunk_geometry(num, res, contour_length, seed, index)
  return render(geom, markers(geom, labels), res).reshape(num, res * res)
