"""Pathfinder's pixels: paddles and markers drawn, per-resolution tables.

The drawing half of the Pathfinder generator (lra/data/pathfinder_gen.py
grows the snakes' geometry and calls `tables` and `render`): Pillow's
8-bit Lanczos resize in exact integer arithmetic, the tables of every
paddle a resolution and margin can draw (its line and its mask, one entry
per rounded end point on the large canvas), and the rendering of a
geometry plus its two markers into uint8 images. Coordinates are integer
pixels (row, column); 'translate' moves a point by a distance along an
angle and rounds both coordinates UP, as the original's translate_coord.

  * Paddle: a line thickness x antialias px wide (1 px at 32 px) drawn by
    Pillow on a canvas `antialias` times larger, Lanczos-downsampled
    (Pillow's 8-bit filter, as scipy.misc.imresize did), then scaled by
    its contrast. Its 'mask'
    is the same line dilated by a disc of margin x antialias px, downsampled
    alike, values /255. Both are looked up in tables (one entry per
    possible rounded end point on the large canvas).
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
"""

import dataclasses
import functools

import numpy as np


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
COLLIDE = 1.8  # mask + new paddle mask must stay below this
# Every mask value is a level k / 255 in float32 (Lanczos output, or 1 on
# the border), so masks are stored as uint8 levels; VALUE[k] is the float64
# the original computed with (float32 k / 255, widened).
VALUE = (np.arange(256, dtype=np.float32) / np.float32(255)).astype(np.float64)


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


def translate(y, x, theta, dist):
  """The original's translate_coord: move, then round both coordinates up."""
  return (
    np.ceil(y + dist * np.sin(theta)).astype(np.int64),
    np.ceil(x + dist * np.cos(theta)).astype(np.int64),
  )


def flip(theta):
  """The reversed angle in (-pi, pi] as the original's flip_by_pi."""
  return np.where(theta < 0, theta + np.pi, theta - np.pi)


def disc_offsets(radius):
  """Offsets (dy, dx) of the original's generate_dilation_struct."""
  r = int(radius)
  dy, dx = np.mgrid[-r : r + 1, -r : r + 1]
  keep = dy * dy + dx * dx <= r * r
  return dy[keep], dx[keep]


def dilate(img, dy, dx):
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
    ey, ex = translate(c, c, theta, self.span)
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
  dy, dx = disc_offsets(margin * aa)
  lines, masks = [], []
  c = half * aa
  for ey in range(c - span, c + span + 1):
    for ex in range(c - span, c + span + 1):
      im = Image.new('L', (big, big), 0)
      ImageDraw.Draw(im).line([(c, c), (ex, ey)], fill=255, width=width)
      blown = np.asarray(im, np.uint8)
      lines.append(resize(blown, 2 * half + 1))
      grown = dilate(blown, dy, dx)
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
    disc_offsets(margin),
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
  t.cand = (off[:, 0], off[:, 1], angle, t.patch(flip(angle)))
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
    [dilate(ones, sdy[i][valid[i]], sdx[i][valid[i]]).all() for i in range(360)]
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
    blocked = dilate(taken, sdy[i][v], sdx[i][v])
    t.first_tails.append(np.flatnonzero(~blocked & t.seed_ok[i]))
  return t


# ---------------------------------------------------------------- render


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
