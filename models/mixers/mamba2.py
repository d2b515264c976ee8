"""Mamba-2: the SSD (state space duality) mixer, in its chunked matrix form.

Dao, Gu, "Transformers are SSMs: Generalized Models and Efficient
Algorithms Through Structured State Space Duality" (arXiv 2405.21060),
sections 6-7 and Listing 1. With I = expand * E inner channels in H heads of
P = head_dim channels (I = H P), N states and one group (B, C shared by the
heads):
  [z, x, B, C, dt] = in_proj(input)           E -> 2 I + 2 N + H (no bias)
  [x, B, C] = SiLU(causal depthwise conv1d([x, B, C]))   width K, bias
  dt_t = softplus(dt_t + dt_bias)              one step per head [H]
  A = -exp(A_log)                              one scalar per head [H]
  h_t = exp(dt_t A_h) h_(t-1) + dt_t x_t B_t^T  per head, h_t [P, N]
  y_t = h_t C_t + D_h x_t                      per head, [P]
  out = out_proj(RMSNorm(y (.) SiLU(z)) (.) w)  I -> E (no bias), eps 1e-5
The recurrence is run as the SSD chunked matrix form (Listing 1,
mamba_ssm/modules/ssd_minimal.py): L is cut into chunks of C = chunk_size
positions; a_t = dt_t A_h are the log-decays, and
  intra-chunk:  y_i += sum_(j<=i) exp(a_(j+1) + .. + a_i) (C_i . B_j) dt_j x_j
                (the mask of segment sums, computed stably: cumulative sums
                of the a_k themselves, never differences of cumsums; then
                an [H, C, C] matrix times the chunk's x by matmuls),
  chunk states: S_q = sum_j exp(a_(j+1) + .. + a_last) dt_j x_j B_j^T,
  inter-chunk:  h_(q+1) = exp(a_1 + .. + a_last) h_q + S_q, a jax.lax.scan
                over the chunks of the [H, P, N] state,
                y_i += exp(a_1 + .. + a_i) h_q C_i.
Initialisation as the authors (state-spaces/mamba,
mamba_ssm/modules/mamba2.py): A_h ~ U[1, 16] (A_init_range), D = 1 per head,
dt_bias = softplus^-1(dt) with dt = exp(U[log dt_min, log dt_max]) floored
at 1e-4, the norm's weight 1, in_proj, out_proj and the conv PyTorch's
default U(+-fan_in^-1/2) (the conv's fan in is K).

Cost per example and direction: time O(L C (N + I) + L I N) (the C x C
products, the chunk states and the inter-chunk readout), memory
O(L (H C + I) + (L / C) I N) (the masks, the inputs, one state per chunk;
kept for the backward pass); no [L, L] array. State per example (recurrent
inference) I N + (I + 2 N)(K - 1) numbers (the SSM state and the conv's
last K - 1 inputs). Log-decays, segment sums, exponentials, the conv, the
matmuls of the SSD (precision HIGHEST) and the norm in float32 whatever the
compute dtype; in_proj and out_proj in the compute dtype.

Exact limits (tests/test_mixer_mamba2.py): the chunked form equals the
recurrence above run step by step in float64, for any chunk size; with dt_t
the same for every channel of a head and A constant over a head's channels
and states, Mamba's selective scan (models/mixers/mamba.py, selective_scan)
is this same recurrence, and the two agree.

Non-causal masks (bidirectional): a second set of conv, dt_bias, A_log and D
parameters runs the same SSD over the reversed sequence (a plain flip, as
mamba.py: the padding then comes first and, being identity steps, leaves
the zero state alone); both directions share in_proj, the norm and
out_proj, and are summed before the gated norm,
out = out_proj(RMSNorm((y_fwd + reverse(y_bwd)) (.) SiLU(z))), as mamba.py's
bidirectional form. Every instance holds both directions (causality is the
mask's, known at call time); a causal model leaves the backward ones alone.

Padding (beyond the builder's zeroed inputs): dt is 0 at padded steps, so
exp(0 A) = 1 and dt x B^T = 0: a padded step is the identity on the state
wherever it is, and the chunks' tail padding (L to a multiple of C) is the
same identity. The conv's input is zero at padded positions (no in_proj
bias) and its output is zeroed there; z is 0 there too, so the gated norm
reads 0 (finite, eps > 0), and the output is multiplied by the real mask
(an all-padded example gives zeros).

Options (`model.attention.<option>`): expand (2), state_size (N, default
64: the ssd_minimal test's size, half the authors' module default of 128,
to keep CPU runs cheap), head_dim (P, default 64 as the authors; min(P, I)
is used, so a small width runs with one head; it must divide I),
conv_width (K, 4), chunk_size (C, default 64; the authors' kernels use
256), dt_min, dt_max (0.001, 0.1).

Deliberate differences from the authors' code: the chunked form in XLA
einsums and a lax.scan, not the fused Triton kernels (same SSD, float32);
ngroups = 1 only, no d_ssm (MLP) split, D per head only (D_has_hdim False),
no dt_limit clamp (the authors' default (0, inf)); no residual rescaling of
out_proj by the depth (the block's business); num_heads from the builder is
not used (H = I / P, as the authors); no dropout (Mamba-2 has none:
dropout_rate is accepted and ignored); the bidirectional form above is not
in the paper.

Shape names: I inner channels, H heads, P head dim, N states, K conv width,
Q chunks, C chunk length, F in_proj outputs, G directions, X rows (G B).
"""

import math

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from models.attention.base import int_option
from models.attention.registry import register
from models.errors import UserError
from models.mixers.base import (
  SequenceMixer,
  causal_conv,
  f32_param,
  inverse_softplus,
  numpy_rng,
  real_BxL,
  step_range_option,
  zero_padded,
)

_F32 = jnp.float32
_HIGHEST = jax.lax.Precision.HIGHEST
# PyTorch's default nn.Linear kernel: U(+-1/sqrt(fan_in)).
TORCH_LINEAR = nnx.initializers.variance_scaling(1 / 3, 'fan_in', 'uniform')
# The authors' A_init_range, dt_init_floor and RMSNormGated eps.
A_INIT_RANGE = (1.0, 16.0)
DT_FLOOR = 1e-4
NORM_EPS = 1e-5


def _einsum(spec, *operands):
  return jnp.einsum(spec, *operands, precision=_HIGHEST)


def segsum(a_XxC):
  """seg[..., i, j] = a_(j+1) + .. + a_i for j <= i (0 on and above the
  diagonal's right: the caller masks j > i). Stable: a cumulative sum of the
  masked a_k themselves, not the difference of two cumulative sums (the
  authors' ssd_minimal segsum). float32 [..., C, C]."""
  c = a_XxC.shape[-1]
  below_CxC = jnp.tril(jnp.ones((c, c), bool), -1)  # k > j
  a_XxCxC = jnp.where(below_CxC, a_XxC[..., :, None], 0.0)  # [k, j] = a_k
  return jnp.cumsum(a_XxCxC, axis=-2)


def ssd(x_XxLxHxP, dt_XxLxH, a_XxH, b_XxLxN, c_XxLxN, chunk):
  """y_t = h_t C_t, h_t = exp(dt_t A) h_(t-1) + dt_t x_t B_t^T, h_-1 = 0,
  per head (A [X, H] one scalar per head and row), by the chunked matrix
  form in chunks of min(chunk, L) positions (L padded with identity steps,
  dt = 0). float32 [X, L, H, P]."""
  x_XxLxHxP, dt_XxLxH, a_XxH, b_XxLxN, c_XxLxN = (
    t.astype(_F32) for t in (x_XxLxHxP, dt_XxLxH, a_XxH, b_XxLxN, c_XxLxN)
  )
  rows, length, h, p = x_XxLxHxP.shape
  n = b_XxLxN.shape[-1]
  c = min(chunk, length)
  q = -(-length // c)

  def chunks(t):  # [X, L, ...] -> [X, Q, C, ...], padded with zeros.
    t = jnp.pad(t, ((0, 0), (0, q * c - length)) + ((0, 0),) * (t.ndim - 2))
    return t.reshape((rows, q, c) + t.shape[2:])

  xdt_XxQxCxHxP = chunks(x_XxLxHxP * dt_XxLxH[..., None])
  b_XxQxCxN, c_XxQxCxN = chunks(b_XxLxN), chunks(c_XxLxN)
  # Log-decays a_t = dt_t A_h, heads before positions: [X, Q, H, C].
  loga_XxQxHxC = jnp.swapaxes(chunks(dt_XxLxH * a_XxH[:, None, :]), -1, -2)
  seg_XxQxHxCxC = segsum(loga_XxQxHxC)
  tril_CxC = jnp.tril(jnp.ones((c, c), bool))
  decay_XxQxHxCxC = jnp.where(tril_CxC, jnp.exp(seg_XxQxHxCxC), 0.0)

  # 1. Intra-chunk: (L-mask (.) C B^T) times dt x.
  cb_XxQxCxC = _einsum('xqin,xqjn->xqij', c_XxQxCxN, b_XxQxCxN)
  m_XxQxHxCxC = decay_XxQxHxCxC * cb_XxQxCxC[:, :, None]
  y_XxQxCxHxP = _einsum('xqhij,xqjhp->xqihp', m_XxQxHxCxC, xdt_XxQxCxHxP)

  # 2. Each chunk's own final state (from a zero start): decay to its end.
  to_end_XxQxHxC = decay_XxQxHxCxC[..., -1, :]
  s_XxQxHxPxN = _einsum(
    'xqhj,xqjhp,xqjn->xqhpn', to_end_XxQxHxC, xdt_XxQxCxHxP, b_XxQxCxN
  )

  # 3. Inter-chunk: the state entering each chunk, scanned over chunks.
  cum_XxQxHxC = jnp.cumsum(loga_XxQxHxC, axis=-1)
  whole_QxXxH = jnp.moveaxis(jnp.exp(cum_XxQxHxC[..., -1]), 1, 0)

  def step(h_XxHxPxN, xs):
    s_XxHxPxN, decay_XxH = xs
    return decay_XxH[..., None, None] * h_XxHxPxN + s_XxHxPxN, h_XxHxPxN

  h0_XxHxPxN = jnp.zeros((rows, h, p, n), _F32)
  _, h_QxXxHxPxN = jax.lax.scan(
    step, h0_XxHxPxN, (jnp.moveaxis(s_XxQxHxPxN, 1, 0), whole_QxXxH)
  )

  # 4. The entering state read out, decayed to each position.
  y_off_XxQxCxHxP = _einsum('xqin,qxhpn->xqihp', c_XxQxCxN, h_QxXxHxPxN)
  from_start_XxQxCxH = jnp.swapaxes(jnp.exp(cum_XxQxHxC), -1, -2)
  y_XxQxCxHxP = y_XxQxCxHxP + y_off_XxQxCxHxP * from_start_XxQxCxH[..., None]
  return y_XxQxCxHxP.reshape(rows, q * c, h, p)[:, :length]


class Mamba2Direction(nnx.Module):
  """The conv and SSD parameters of one scan direction."""

  # The Mamba-2 authors' _no_weight_decay parameters (state-spaces/mamba,
  # mamba_ssm/modules/mamba2.py): A_log, D and dt_bias.
  ssm_params = ('a_log_H', 'd_H', 'dt_bias_H')

  def __init__(self, inner, state, heads, width, dt_min, dt_max, rng):
    channels = inner + 2 * state
    bound = width**-0.5
    self.conv_KxF = f32_param(rng.uniform(-bound, bound, (width, channels)))
    self.conv_bias_F = f32_param(rng.uniform(-bound, bound, (channels,)))
    log_dt_H = rng.uniform(math.log(dt_min), math.log(dt_max), (heads,))
    dt_H = np.maximum(np.exp(log_dt_H), DT_FLOOR)
    self.dt_bias_H = f32_param(inverse_softplus(dt_H))
    self.a_log_H = f32_param(np.log(rng.uniform(*A_INIT_RANGE, (heads,))))
    self.d_H = f32_param(np.ones((heads,)))
    self.inner, self.state, self.heads = inner, state, heads

  def ssd_inputs(self, xbc_BxLxF, dt_BxLxH, real_BxL):
    """conv input (zero at padding) and raw dt -> the SSD's inputs, float32:
    (x [B, L, H, P], dt [B, L, H], A [H], B [B, L, N], C [B, L, N])."""
    i, n, h = self.inner, self.state, self.heads
    keep_BxLx1 = real_BxL[:, :, None]
    u_BxLxF = causal_conv(xbc_BxLxF, self.conv_KxF[...], self.conv_bias_F[...])
    u_BxLxF = jnp.where(keep_BxLx1, jax.nn.silu(u_BxLxF), 0.0)
    b, length = u_BxLxF.shape[:2]
    x_BxLxHxP = u_BxLxF[..., :i].reshape(b, length, h, i // h)
    b_BxLxN, c_BxLxN = u_BxLxF[..., i : i + n], u_BxLxF[..., i + n :]
    dt_BxLxH = jax.nn.softplus(dt_BxLxH + self.dt_bias_H[...])
    # A padded step is the identity: exp(0 A) = 1, 0 x B = 0.
    dt_BxLxH = jnp.where(keep_BxLx1, dt_BxLxH, 0.0)
    a_H = -jnp.exp(self.a_log_H[...])
    return x_BxLxHxP, dt_BxLxH, a_H, b_BxLxN, c_BxLxN


@register('mamba2')
class Mamba2(SequenceMixer):
  """Mamba-2's SSD mixer (causal, or bidirectional by two passes)."""

  def __init__(
    self,
    *,
    emb_dim,
    num_heads,
    max_length,
    dropout_rate,
    dtype,
    rngs,
    layer_index=0,
    expand=2,
    state_size=64,
    head_dim=64,
    conv_width=4,
    chunk_size=64,
    dt_min=0.001,
    dt_max=0.1,
  ):
    """Args (own options):
    expand: inner channels I = expand * emb_dim.
    state_size: N, states per head (shared B, C: one group).
    head_dim: P, channels per head; min(P, I) is used and must divide I.
    conv_width: K, the causal depthwise conv's width.
    chunk_size: C, positions per chunk of the SSD matrix form.
    dt_min, dt_max: range of the initial dt (log-uniform).
    """
    del num_heads, max_length, dropout_rate, layer_index
    name = 'mamba2'
    expand = int_option(name, 'expand', expand, 1, 2)
    state = int_option(name, 'state_size', state_size, 1, 64)
    head_dim = int_option(name, 'head_dim', head_dim, 1, 64)
    width = int_option(name, 'conv_width', conv_width, 1, 4)
    self.chunk_size = int_option(name, 'chunk_size', chunk_size, 1, 64)
    dt_min, dt_max = step_range_option(name, dt_min, dt_max)
    inner = expand * emb_dim
    p = min(head_dim, inner)
    if inner % p:
      raise UserError(
        f'mamba2 head_dim must divide the inner width expand * emb_dim = '
        f'{inner}, got {head_dim}; set e.g. '
        f'--config.model.attention.head_dim={math.gcd(inner, head_dim)}.'
      )
    self.inner, self.num_states, self.conv_width = inner, state, width
    self.heads, self.head_dim = inner // p, p
    self.dtype = dtype
    linear = lambda i, o: nnx.Linear(  # noqa: E731
      i, o, use_bias=False, kernel_init=TORCH_LINEAR, dtype=dtype, rngs=rngs
    )
    # Order [z, x, B, C, dt], as the authors'.
    self.in_proj = linear(emb_dim, 2 * inner + 2 * state + self.heads)
    rng = numpy_rng(rngs)
    direction = lambda: Mamba2Direction(  # noqa: E731
      inner, state, self.heads, width, dt_min, dt_max, rng
    )
    self.fwd = direction()
    self.bwd = direction()
    self.norm_I = f32_param(np.ones((inner,)))
    self.out_proj = linear(inner, emb_dim)

  def state_size(self):
    """I N SSM states + (I + 2 N)(K - 1) conv inputs per example (one
    direction, as for causal recurrent inference)."""
    i, n = self.inner, self.num_states
    return i * n + (i + 2 * n) * (self.conv_width - 1)

  def __call__(self, x_BxLxE, mask, *, rngs=None):
    del rngs
    b, length, _ = x_BxLxE.shape
    i, n = self.inner, self.num_states
    real = real_BxL(mask, b, length)
    proj_BxLxF = self.in_proj(zero_padded(x_BxLxE, mask).astype(self.dtype))
    proj_BxLxF = proj_BxLxF.astype(_F32)
    z_BxLxI = proj_BxLxF[..., :i]
    xbc_BxLxF = proj_BxLxF[..., i : 2 * i + 2 * n]
    xbc_BxLxF = jnp.where(real[:, :, None], xbc_BxLxF, 0.0)
    dt_BxLxH = proj_BxLxF[..., 2 * i + 2 * n :]
    flip = lambda t: t[:, ::-1]  # noqa: E731
    directions = [(self.fwd, xbc_BxLxF, dt_BxLxH, real)]
    if not mask.causal:
      directions.append((self.bwd, flip(xbc_BxLxF), flip(dt_BxLxH), flip(real)))
    # Both directions in one SSD: rows stacked as [G B, ...].
    per_direction = [d.ssd_inputs(x, t, r) for d, x, t, r in directions]
    xs, dt, a, bm, cm = (jnp.stack(t) for t in zip(*per_direction))
    g = len(directions)
    rows = lambda t: t.reshape((g * b,) + t.shape[2:])  # noqa: E731
    a_XxH = jnp.repeat(a, b, axis=0)
    y_XxLxHxP = ssd(
      rows(xs), rows(dt), a_XxH, rows(bm), rows(cm), self.chunk_size
    )
    d_GxH = jnp.stack([d.d_H[...] for d, _, _, _ in directions])
    y_GxBxLxHxP = (
      y_XxLxHxP.reshape(xs.shape) + d_GxH[:, None, None, :, None] * xs
    )
    y_BxLxI = y_GxBxLxHxP[0].reshape(b, length, i)
    if not mask.causal:
      y_BxLxI = y_BxLxI + flip(y_GxBxLxHxP[1].reshape(b, length, i))
    # The authors' RMSNormGated, norm_before_gate=False, one group.
    g_BxLxI = y_BxLxI * jax.nn.silu(z_BxLxI)
    rms_BxLx1 = jnp.mean(jnp.square(g_BxLxI), axis=-1, keepdims=True)
    g_BxLxI = g_BxLxI * jax.lax.rsqrt(rms_BxLx1 + NORM_EPS) * self.norm_I[...]
    out_BxLxE = self.out_proj(g_BxLxI.astype(self.dtype))
    out_BxLxE = jnp.where(real[:, :, None], out_BxLxE, 0)
    return out_BxLxE.astype(x_BxLxE.dtype), {}
