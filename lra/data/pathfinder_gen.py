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
  * Paddle: a line thickness x antialias px wide (1 px at 32 px) drawn by
    Pillow on a canvas `antialias` times larger, Lanczos-downsampled
    (Pillow's 8-bit filter, as scipy.misc.imresize did), then scaled by
    its contrast. Its 'mask'
    is the same line dilated by a disc of margin x antialias px, downsampled
    alike, values /255. Both are looked up in tables (one entry per
    possible rounded end point on the large canvas).
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
  * Markers: discs of marker_radius drawn on the large canvas at the tail
    of a random target and at the head (last paddle) of the same target
    (label 1) or of the other (label 0), each downsampled alike; the image
    is the maximum of paddles and markers, then min-max rescaled to 0..255
    (scipy's bytescale, as imsave did): the brightest ink becomes 255, and
    most ink is faint (Lanczos halos). The label changes only the markers.

Parameters per resolution (RESOLUTIONS). Sources: 'LRA' = the argument
noted for that resolution in lra_benchmarks/data/pathfinder.py; 'wrapper'
= snakes2_wrapper.py's value (which the notes left unchanged); 'code' =
snakes2.py / snakes.py.

  res  paddle thick margin marker seed  contin. distr.  contrast  padding
                                   dist         paddles target/distr.
  32     2    0.5    1      1.5    7     1.0     20     1.5 / 2     1
  64     5    1.0    1      2.5   12     1.8     22     0.8 / 0.8   1
  128    5    1.5   2|3     3     20     1.8     35     0.9 / 0.9   1
  256    5    2.0    3      5     27     1.8     30     1.0 / 1.0  22

  * paddle: LRA for 32; wrapper's default 5 for 64-256 (not in the notes).
  * thick, margin (drawn per image from the list), marker, continuity,
    distractor paddles: LRA.
  * seed distance: LRA; 256: the wrapper's default 27.
  * contrast: the targets get paddle_contrast x snake_contrast, the
    distractors snake_contrast (code: two_snakes vs make_many_snakes);
    32: LRA's snake_contrast [2], paddle_contrast [0.75]; 64-256: LRA's
    snake_contrast, paddle_contrast the default [1.0].
  * padding: LRA (1); 256: the wrapper's default 22.
  * antialias 2: LRA (every resolution).
  * single paddles: off. The wrapper sets use_single_paddles = False right
    after the lines the LRA notes copy, and from_wrapper needs the
    wrapper's segmentation_task line, so the release ran through it.
  * contour lengths: easy 6 (the release's curv_baseline), intermediate
    9, hard 14 paddles per target (wrapper; LRA's folders).
  * retries: 3 head draws per paddle and 3 seed draws (max_paddle_retrial
    2), 5 tries per distractor snake (max_distractor_contour_retrial 4),
    0.3 / 1.8 / 1% thresholds: code defaults.

Determinism: chunk i of a data set draws from numpy's generator seeded with
(seed, i), so the images depend on (seed, index) only, not on the worker
count; the labels change only the markers. The same numpy and CPU give the
same bytes. VERSION names this algorithm in cache names: a cache made by
another version of the generator is never reused.
"""

import dataclasses
import functools

import numpy as np

VERSION = 2


@dataclasses.dataclass(frozen=True)
class Params:
  """The original's arguments for one resolution (pixels of the output)."""

  paddle_length: int
  thickness: float
  margins: tuple  # one is drawn per image
  marker_radius: float
  seed_distance: int
  continuity: float
  distractor_paddles: int  # num_distractor_snakes = this // snake length
  target_contrast: float
  distractor_contrast: float
  padding: int
  antialias: int = 2
  single_paddles: bool = False


RESOLUTIONS = {
  32: Params(2, 0.5, (1,), 1.5, 7, 1.0, 20, 1.5, 2.0, 1),
  64: Params(5, 1.0, (1,), 2.5, 12, 1.8, 22, 0.8, 0.8, 1),
  128: Params(5, 1.5, (2, 3), 3.0, 20, 1.8, 35, 0.9, 0.9, 1),
  256: Params(5, 2.0, (3,), 5.0, 27, 1.8, 30, 1.0, 1.0, 22),
}
CONTOUR_LENGTHS = {'easy': 6, 'intermediate': 9, 'hard': 14}
HEAD_DRAWS = 3  # max_paddle_retrial 2: 3 draws of a paddle's head
SEED_DRAWS = 3  # ... and of a snake's first paddle
SNAKE_TRIES = 5  # max_distractor_contour_retrial 4
SINGLE_TRIES = 3  # single paddles: max_paddle_retrial 2
COLLIDE = 1.8  # mask + new paddle mask must stay below this
TAKEN = 0.3  # a pixel whose mask exceeds this is taken
# Every mask value is a level k / 255 in float32 (Lanczos output, or 1 on
# the border), so masks are stored as uint8 levels; VALUE[k] is the float64
# the original computed with (float32 k / 255, widened).
VALUE = (np.arange(256, dtype=np.float32) / np.float32(255)).astype(np.float64)
TAKEN_LEVEL = int(np.nonzero(VALUE <= TAKEN)[0].max())  # levels above: taken
FULL = 0.01  # a snake is not started when under 1% of pixels are free
TAIL_DRAWS = 16  # uniform draws before the exact list of free tails
CHUNK = 1024  # images per chunk: the unit of seeding and of work
MAX_CELLS = 1 << 26  # mask pixels (bytes) of candidates grown at once


# ---------------------------------------------------------------- resizing


def _lanczos(x):
  """Pillow's Lanczos-3 filter (sinc(x) sinc(x/3) on [-3, 3))."""
  x = np.asarray(x, np.float64)
  out = np.sinc(x) * np.sinc(x / 3)
  return np.where((x >= -3) & (x < 3), out, 0.0)


@functools.cache
def resize_matrix(n_in, n_out):
  """Fixed-point weights [n_out, n_in] of Pillow's 8-bit Lanczos resize.

  As Pillow's precompute_coeffs: the filter is stretched by the reduction
  factor, cut at the edges and renormalised there, and rounded to 22-bit
  fixed point (away from zero).
  """
  scale = n_in / n_out
  stretch = max(scale, 1.0)
  support = 3.0 * stretch
  k = np.zeros((n_out, n_in), np.float64)
  for o in range(n_out):
    center = (o + 0.5) * scale
    lo = max(int(center - support + 0.5), 0)
    hi = min(int(center + support + 0.5), n_in)
    w = _lanczos((np.arange(lo, hi) - center + 0.5) / stretch)
    total = w.sum()
    k[o, lo:hi] = w / total if total else w
  fixed = np.where(k < 0, -0.5 + k * (1 << 22), 0.5 + k * (1 << 22))
  return np.trunc(fixed)


def _fixed_to_uint8(acc):
  """Pillow's clip8: (acc + 2**21) >> 22, clipped to 0..255."""
  return np.clip(np.floor((acc + (1 << 21)) / (1 << 22)), 0, 255)


def resize(img, n_out):
  """uint8 [..., n, n] -> uint8 [..., n_out, n_out], as Pillow's
  Image.resize(LANCZOS) of an 'L' image: rows first, then columns, each
  pass rounded to 8 bits. Exact integer arithmetic in float64."""
  k = resize_matrix(img.shape[-1], n_out)
  rows = _fixed_to_uint8(img.astype(np.float64) @ k.T)
  return _fixed_to_uint8(k @ rows).astype(np.uint8)


# ---------------------------------------------------------------- tables


def _translate(y, x, theta, dist):
  """The original's translate_coord: move, then round both coordinates up."""
  return (
    np.ceil(y + dist * np.sin(theta)).astype(np.int64),
    np.ceil(x + dist * np.cos(theta)).astype(np.int64),
  )


def _flip(theta):
  """The reversed angle in (-pi, pi] as the original's flip_by_pi."""
  return np.where(theta < 0, theta + np.pi, theta - np.pi)


def _disc(radius):
  """Offsets (dy, dx) of the original's generate_dilation_struct."""
  r = int(radius)
  dy, dx = np.mgrid[-r : r + 1, -r : r + 1]
  keep = dy * dy + dx * dx <= r * r
  return dy[keep], dx[keep]


def _dilate(img, dy, dx):
  """Maximum of img over offsets (dy, dx), outside pixels ignored."""
  h, w = img.shape[-2:]
  r = int(max(np.abs(dy).max(), np.abs(dx).max()))
  pad = np.zeros(img.shape[:-2] + (h + 2 * r, w + 2 * r), img.dtype)
  pad[..., r : r + h, r : r + w] = img
  out = np.zeros_like(img)
  for a, b in zip(dy, dx):
    out = np.maximum(out, pad[..., r + a : r + a + h, r + b : r + b + w])
  return out


@dataclasses.dataclass
class _Tables:
  """Everything about paddles that depends only on (resolution, margin)."""

  p: Params
  res: int
  margin: int
  half: int  # a paddle patch is (2 half + 1)^2, centred on its start
  span: int  # paddle length on the large canvas
  line: np.ndarray  # uint8 [E, S, S] per end point
  mask: np.ndarray  # uint8 levels [E, S, S]
  cand: tuple  # (dy, dx, angle, patch of the flipped angle) [K] each
  small: tuple  # (dy, dx) of the disc of margin px
  seed_patch: np.ndarray  # int [360]: patch of degree d - 180
  seed_struct: tuple  # (dy [360, Q], dx [360, Q], valid [360, Q])
  seed_ok: np.ndarray  # bool [360]: angles at which a snake can start
  hot: tuple  # (dy, dx, value) [E, H]: mask pixels >= COLLIDE - 1
  ink: tuple  # (dy, dx, value) [E, I]: nonzero mask pixels
  first_tails: list  # per degree: flat pixels where a first tail may go

  def patch(self, theta):
    """Table index of the paddle drawn from its start along theta."""
    c = self.half * self.p.antialias
    ey, ex = _translate(c, c, theta, self.span)
    n = 2 * self.span + 1
    return (ey - c + self.span) * n + (ex - c + self.span)


def _pixels(patches, keep, half, fill):
  """(dy, dx, value float64) [E, N] of the kept pixels of each patch,
  padded with offset 0 and `fill`."""
  n = max(1, int(keep.sum((1, 2)).max()))
  dy = np.zeros((len(patches), n), np.int64)
  dx = np.zeros((len(patches), n), np.int64)
  val = np.full((len(patches), n), fill, patches.dtype)
  for e in range(len(patches)):
    ky, kx = np.nonzero(keep[e])
    dy[e, : len(ky)], dx[e, : len(kx)] = ky - half, kx - half
    val[e, : len(ky)] = patches[e][ky, kx]
  return dy, dx, val


@functools.cache
def tables(res, margin):
  """The paddle tables of one resolution and margin (cached per process)."""
  from PIL import Image, ImageDraw  # the line rasteriser of the original

  p = RESOLUTIONS[res]
  aa, length = p.antialias, p.paddle_length
  half = length + int(np.ceil(p.thickness)) + margin
  big = 2 * half * aa + 1
  span = length * aa
  width = int(round(p.thickness * aa))
  dy, dx = _disc(margin * aa)
  lines, masks = [], []
  c = half * aa
  for ey in range(c - span, c + span + 1):
    for ex in range(c - span, c + span + 1):
      im = Image.new('L', (big, big), 0)
      ImageDraw.Draw(im).line([(c, c), (ex, ey)], fill=255, width=width)
      blown = np.asarray(im, np.uint8)
      lines.append(resize(blown, 2 * half + 1))
      grown = _dilate(blown, dy, dx)
      masks.append(resize(grown, 2 * half + 1))
  t = _Tables(
    p,
    res,
    margin,
    half,
    span,
    np.stack(lines),
    np.stack(masks),
    (),
    _disc(margin),
    np.zeros(0),
    (),
    np.zeros(0, bool),
    (),
    (),
    [],
  )
  t.hot = _pixels(VALUE[t.mask], VALUE[t.mask] >= COLLIDE - 1, half, -10.0)
  t.ink = _pixels(t.mask, t.mask > 0, half, 0)
  # Candidate heads: one sample per pixel of arc on the circle of radius
  # paddle + margin, truncated to pixels, duplicates merged.
  step = length + margin
  deg = np.arange(0, 360, 360 / (2 * step * np.pi)) * np.pi / 180
  off = np.stack(
    [np.floor(step * np.sin(deg)), np.floor(step * np.cos(deg))], 1
  ).astype(np.int64)
  off = np.unique(off, axis=0)
  angle = np.arctan2(off[:, 0], off[:, 1]).astype(np.float64)
  t.cand = (off[:, 0], off[:, 1], angle, t.patch(_flip(angle)))
  # A snake's first paddle: the tail is free when no taken pixel lies under
  # the paddle's mask placed one pixel off (the original dilates by the
  # mask cut to a (2 (paddle + margin) + 1)^2 kernel around tail + 1).
  theta = np.arange(-180, 180) * np.pi / 180
  t.seed_patch = t.patch(theta)
  z = length + margin
  structs = []
  for e in t.seed_patch:
    m = VALUE[t.mask[e]]
    rows = np.arange(2 * half + 1) - half + z + 1  # kernel row of each
    keep = (rows >= 0) & (rows <= 2 * z)
    ky, kx = np.nonzero(m[np.ix_(keep, keep)] >= 1.0)
    structs.append((rows[keep][ky] - z, rows[keep][kx] - z))
  q = max(len(a) for a, _ in structs)
  sdy = np.zeros((360, q), np.int64)
  sdx = np.zeros((360, q), np.int64)
  valid = np.zeros((360, q), bool)
  for i, (a, b) in enumerate(structs):
    sdy[i, : len(a)], sdx[i, : len(b)], valid[i, : len(a)] = a, b, True
  t.seed_struct = (sdy, sdx, valid)
  # The original dilates a float64 mask with OpenCV, whose border value is
  # then -DBL_MAX: a pixel whose kernel lies wholly outside the image gets
  # it, the availability map goes negative and the original reports no
  # free pixel at all. Whether that happens depends on the angle only; at
  # 32 px it rules out about 9 angles in 10 (most first paddles fail).
  ones = np.ones((res, res), np.int64)
  t.seed_ok = np.array(
    [
      _dilate(ones, sdy[i][valid[i]], sdx[i][valid[i]]).all()
      for i in range(360)
    ]
  )
  # First target tails: free pixels of the central square, per degree.
  taken = np.zeros((res, res), bool)
  band = 2 * p.seed_distance
  taken[:band], taken[res - band :] = True, True
  taken[:, :band], taken[:, res - band :] = True, True
  taken[: p.padding], taken[-p.padding :] = True, True
  taken[:, : p.padding], taken[:, -p.padding :] = True, True
  for i in range(360):
    v = valid[i]
    blocked = _dilate(taken, sdy[i][v], sdx[i][v])
    t.first_tails.append(np.flatnonzero(~blocked & t.seed_ok[i]))
  return t


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
      blocked = _dilate(taken[i, pad:-pad, pad:-pad], sdy[i][v], sdx[i][v])
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
  py, px = _translate(s.py, s.px, s.theta, t.p.paddle_length + 2 * t.margin)
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
    hy, hx = _translate(ty, tx, th, length)
    vy, vx = _translate(hy, hx, _flip(th), step)
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
    hy, hx = _translate(ty, tx, th, length)
    vy, vx = _translate(hy, hx, _flip(th), step)
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
    hy, hx = _translate(ty, tx, th, t.p.paddle_length)
    vy, vx = _translate(hy, hx, _flip(th), t.p.paddle_length + t.margin)
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


def markers(geom, labels):
  """[B, 2, 2]: the origin target's tail, and the head of the same target
  (label 1) or of the other one (label 0)."""
  rows, origin = np.arange(len(labels)), geom['origin']
  far = np.where(np.asarray(labels) == 1, origin, 1 - origin)
  return np.stack([geom['tails'][rows, origin], geom['heads'][rows, far]], 1)


def _discs(ends, res, p):
  """uint8 [n, res, res]: a disc of marker_radius drawn on the large canvas
  at each point [n, 2], downsampled (the original's draw_circle)."""
  aa, big = p.antialias, res * p.antialias
  r = int(np.floor(p.marker_radius * aa))
  o = np.arange(-r, r + 1)
  disc = o[:, None] ** 2 + o[None, :] ** 2 <= (p.marker_radius * aa) ** 2
  k = resize_matrix(big, res)  # [res, big]
  rows = ends[:, 0, None] * aa + o  # [n, W]
  cols = ends[:, 1, None] * aa + o
  rin, cin = (rows >= 0) & (rows < big), (cols >= 0) & (cols < big)
  kc = np.where(cin[..., None], k.T[np.clip(cols, 0, big - 1)], 0)
  h = _fixed_to_uint8((disc * 255.0) @ kc) * rin[..., None]  # [n, W, res]
  kr = k[:, np.clip(rows, 0, big - 1)].transpose(1, 0, 2)  # [n, res, W]
  kr = np.where(rin[:, None, :], kr, 0)
  return _fixed_to_uint8(kr @ h).astype(np.uint8)


def render(geom, ends, res, rescale=True):
  """Images uint8 [B, res, res]: the paddles of geom plus markers [B, 2, 2],
  min-max rescaled as the original's imsave (rescale=False: the float
  image before that)."""
  p = RESOLUTIONS[res]
  num = len(ends)
  pad = max(tables(res, m).half for m in p.margins)
  size = res + 2 * pad
  img = np.zeros((num, size, size), np.float32)
  flat_img = img.reshape(-1)
  for m in p.margins:
    t = tables(res, m)
    k = np.arange(-t.half, t.half + 1)
    line = t.line.astype(np.float32) / np.float32(255)
    for slot in range(geom['paddles'].shape[1]):
      q = geom['paddles'][:, slot]
      rows = np.nonzero((q[:, 4] > 0) & (geom['margin'] == m))[0]
      if not len(rows):
        continue
      y, x = q[rows, 0].astype(np.int64), q[rows, 1].astype(np.int64)
      patch = q[rows, 2].astype(np.int64)
      vals = line[patch] * q[rows, 3, None, None].astype(np.float32)
      wy = (rows[:, None] * size + y[:, None] + pad + k)[:, :, None] * size
      flat = wy + (x[:, None] + pad + k)[:, None, :]
      flat_img[flat] = np.maximum(flat_img[flat], vals)
  img = img[:, pad : pad + res, pad : pad + res]
  for i in range(2):
    disc = _discs(ends[:, i], res, p).astype(np.float32) / np.float32(255)
    img = np.maximum(img, disc)
  if not rescale:
    return img
  img = img.astype(np.float64)
  lo = img.min((1, 2), keepdims=True)
  span = img.max((1, 2), keepdims=True) - lo
  scale = 255.0 / np.where(span == 0, 1, span)
  return (((img - lo) * scale).clip(0, 255) + 0.5).astype(np.uint8)


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
