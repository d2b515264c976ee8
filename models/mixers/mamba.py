"""Mamba: the selective state-space mixer, scanned in remat'd chunks.

Gu, Dao, "Mamba: Linear-Time Sequence Modeling with Selective State
Spaces" (arXiv 2312.00752), section 3 and Algorithm 2. With I = expand * E
inner channels and N states per channel:
  [x, z] = in_proj(input)                    E -> 2 I (no bias)
  x = SiLU(causal depthwise conv1d(x))       width K = conv_width, bias
  [dt_t, B_t, C_t] = x_proj(x_t)             I -> R + 2 N (no bias)
  dt_t = softplus(dt_proj(dt_t) + dt_bias)   R -> I, per channel
  A = -exp(A_log)                            real diagonal [I, N]
  h_t = exp(dt_t A) (.) h_(t-1) + dt_t B_t x_t      h_t [I, N]
  y_t = C_t . h_t + D (.) x_t
  out = out_proj(y (.) SiLU(z))              I -> E (no bias)
Initialisation as the paper and the authors' code: A_n = -(n + 1) (S4D-
Real, the same for every channel), D = 1, dt_bias = softplus^-1(dt) with
dt = exp(U[log dt_min, log dt_max]) floored at 1e-4, dt_proj's kernel
U(+-R^-1/2), the linear and conv layers PyTorch's default U(+-fan_in^-1/2).

The scan: h_t is a linear recurrence run one position at a time
(jax.lax.scan over t) on the [G, B, N, I] state, G the directions run
together (both directions are one scan over stacked inputs; A's leading
dims broadcast), each step computing its exp(dt_t A) and dt_t B_t x_t and
reading y_t = C_t . h_t out at once, so no [B, L, I, N] array exists. L is
split into chunks of C = chunk_size positions scanned one after the other
with the state carried, each chunk rematerialised (jax.checkpoint): the
backward pass keeps one [G, B, N, I] state per chunk and recomputes one
chunk's steps at a time (chunk_size >= L: one chunk, no remat). Time
O(L I N) per example and direction, 2 L I N exponentials with the remat
(the forward pass and its recomputation); memory O(L I + (L / C) I N +
C I N) per example and direction; state per example (recurrent inference)
I N + I (K - 1) numbers. Scan, exponentials, conv and sums in float32; the
projections in the compute dtype. On a CPU this is cheaper than an
associative scan over [B, C, I, N] (this module's earlier form, 3.5-4x
slower: log C levels of strided slices of the whole state) or per-channel
chunked matrix forms (C times the exponentials): each step's state stays
in cache (docs/benchmark.md).

Non-causal masks (bidirectional): a second set of conv + x_proj + dt + A +
D parameters runs the same SSM over the reversed sequence; the two
directions share in_proj and out_proj and are summed before the gate,
out = out_proj((y_fwd + reverse(y_bwd)) (.) SiLU(z)), as the two gated
outputs of Vision Mamba's bidirectional block (Zhu et al., arXiv
2401.09417) summed, without its optional halving. Every instance holds
both directions (causality is the mask's, known at call time); a causal
model leaves the backward parameters untouched.

Padding (beyond the builder's zeroed inputs): dt is set to 0 at padded
steps, so exp(0 A) = 1 and dt B x = 0: a padded step is the identity on
the state wherever it is, in both directions (the reversal is a plain
flip: the padding then comes first and leaves the zero initial state
alone). The conv's input is zero at padded positions (no in_proj bias), so
the conv at a real token sees zeros there, as at the start of a sequence;
its output is zeroed at padded positions too, and the mixer's output is
multiplied by the real mask (an all-padded example gives zeros).

Deliberate differences from the authors' code (state-spaces/mamba): the
scan is a jax.lax.scan step per position in remat'd chunks, not the
fused CUDA kernel (same recurrence, same float32 state); in_proj, x_proj
and out_proj use flax's dtype handling (kernels float32, matmuls in the
compute dtype); no residual rescaling of out_proj by the depth (the
block's business); no dropout (Mamba has none: dropout_rate is accepted
and ignored); the bidirectional variant above is not in the Mamba paper.

Shape names: I inner channels, N states, R dt rank, K conv width, C chunk,
G directions, X any leading dims.
"""

import math

from flax import nnx
import jax
import jax.numpy as jnp

from models.attention.base import int_option
from models.attention.registry import register
from models.mixers.base import (
  SequenceMixer,
  real_BxL,
  step_range_option,
  zero_padded,
)

# PyTorch's default nn.Linear kernel: U(+-1/sqrt(fan_in)).
TORCH_LINEAR = nnx.initializers.variance_scaling(1 / 3, 'fan_in', 'uniform')
# The authors' floor on the initial dt.
DT_FLOOR = 1e-4


def symmetric(bound):
  """An initializer drawing U(-bound, bound)."""

  def init(key, shape, dtype=jnp.float32):
    return jax.random.uniform(key, shape, dtype, -bound, bound)

  return init


def inverse_softplus(y):
  """x with softplus(x) = y (y > 0): y + log(1 - exp(-y))."""
  return y + jnp.log(-jnp.expm1(-y))


def selective_scan(u_XxLxI, dt_XxLxI, a_XxIxN, b_XxLxN, c_XxLxN, chunk):
  """y_t = C_t . h_t, h_t = exp(dt_t A) h_(t-1) + dt_t B_t u_t, h_-1 = 0.

  float32 [X, L, I] for any leading dims X (a batch, or directions x batch;
  A's leading dims broadcast against them). One sequential step per
  position on the [X, N, I] state, in chunks of min(chunk, L) positions
  (L padded with identity steps, dt = 0), each chunk rematerialised
  (jax.checkpoint): the backward pass keeps the state at each chunk's start
  and one chunk's steps at a time.
  """
  f32 = lambda t: t.astype(jnp.float32)  # noqa: E731
  u_XxLxI, dt_XxLxI, b_XxLxN, c_XxLxN = map(
    f32, (u_XxLxI, dt_XxLxI, b_XxLxN, c_XxLxN)
  )
  # [N, I]: the state's minor axis is the long one, I.
  a_XxNxI = jnp.swapaxes(f32(a_XxIxN), -1, -2)
  *batch, length, inner = u_XxLxI.shape
  c = min(chunk, length)
  n = -(-length // c)

  def step(h_XxNxI, xs):
    u_XxI, dt_XxI, b_XxN, c_XxN = xs
    decay_XxNxI = jnp.exp(dt_XxI[..., None, :] * a_XxNxI)
    drive_XxNxI = (dt_XxI * u_XxI)[..., None, :] * b_XxN[..., None]
    h_XxNxI = decay_XxNxI * h_XxNxI + drive_XxNxI
    return h_XxNxI, jnp.sum(h_XxNxI * c_XxN[..., None], axis=-2)

  def body(h_XxNxI, xs):  # one chunk: xs [C, X, F]
    return jax.lax.scan(step, h_XxNxI, xs)

  def chunks(t):  # [X, L, F] -> [n, C, X, F]; zeros are identity steps.
    t = jnp.moveaxis(t, -2, 0)
    t = jnp.pad(t, ((0, n * c - length),) + ((0, 0),) * (t.ndim - 1))
    return t.reshape((n, c) + t.shape[1:])

  h_XxNxI = jnp.zeros((*batch, *a_XxNxI.shape[-2:]), jnp.float32)
  xs = tuple(map(chunks, (u_XxLxI, dt_XxLxI, b_XxLxN, c_XxLxN)))
  if n == 1:
    y_CxXxI = body(h_XxNxI, jax.tree.map(lambda t: t[0], xs))[1]
  else:
    _, y_NxCxXxI = jax.lax.scan(jax.checkpoint(body), h_XxNxI, xs)
    y_CxXxI = y_NxCxXxI.reshape((n * c, *batch, inner))
  return jnp.moveaxis(y_CxXxI[:length], 0, -2)


def causal_conv(x_BxLxI, w_KxI, bias_I):
  """Depthwise causal conv: y_t = bias + sum_j w_j x_(t - K + 1 + j), the
  inputs before the start taken as zero (PyTorch's Conv1d, padding K - 1,
  truncated to L). float32."""
  k, length = w_KxI.shape[0], x_BxLxI.shape[1]
  x_BxLxI = jnp.pad(x_BxLxI.astype(jnp.float32), ((0, 0), (k - 1, 0), (0, 0)))
  y_BxLxI = jnp.zeros_like(x_BxLxI[:, :length]) + bias_I.astype(jnp.float32)
  for j in range(k):
    y_BxLxI = (
      y_BxLxI + w_KxI[j].astype(jnp.float32) * x_BxLxI[:, j : j + length]
    )
  return y_BxLxI


class MambaDirection(nnx.Module):
  """The conv and selective-SSM parameters of one scan direction."""

  def __init__(self, inner, state, rank, width, dt_min, dt_max, dtype, rngs):
    bound = width**-0.5
    self.conv_KxI = nnx.Param(symmetric(bound)(rngs.params(), (width, inner)))
    self.conv_bias_I = nnx.Param(symmetric(bound)(rngs.params(), (inner,)))
    self.x_proj = nnx.Linear(
      inner,
      rank + 2 * state,
      use_bias=False,
      kernel_init=TORCH_LINEAR,
      dtype=dtype,
      rngs=rngs,
    )
    self.dt_proj = nnx.Linear(
      rank,
      inner,
      use_bias=False,
      kernel_init=symmetric(rank**-0.5),
      dtype=dtype,
      rngs=rngs,
    )
    log_dt_I = jax.random.uniform(
      rngs.params(),
      (inner,),
      jnp.float32,
      math.log(dt_min),
      math.log(dt_max),
    )
    dt_I = jnp.maximum(jnp.exp(log_dt_I), DT_FLOOR)
    # Added in float32 after the matmul (as the authors' delta_bias).
    self.dt_bias_I = nnx.Param(inverse_softplus(dt_I))
    a_N = jnp.arange(1, state + 1, dtype=jnp.float32)
    self.a_log_IxN = nnx.Param(jnp.log(jnp.broadcast_to(a_N, (inner, state))))
    self.d_I = nnx.Param(jnp.ones((inner,), jnp.float32))
    self.rank, self.state = rank, state
    self.dtype = dtype

  def scan_inputs(self, x_BxLxI, real_BxL):
    """x float32, zero at padded positions -> the scan's inputs, float32:
    (u [B, L, I], dt [B, L, I], A [I, N], B [B, L, N], C [B, L, N])."""
    keep_BxLx1 = real_BxL[:, :, None]
    u_BxLxI = jax.nn.silu(causal_conv(x_BxLxI, self.conv_KxI, self.conv_bias_I))
    u_BxLxI = jnp.where(keep_BxLx1, u_BxLxI, 0.0)
    dbl_BxLxF = self.x_proj(u_BxLxI.astype(self.dtype)).astype(jnp.float32)
    r, n = self.rank, self.state
    dt_BxLxR = dbl_BxLxF[..., :r]
    b_BxLxN, c_BxLxN = dbl_BxLxF[..., r : r + n], dbl_BxLxF[..., r + n :]
    dt_BxLxI = self.dt_proj(dt_BxLxR.astype(self.dtype)).astype(jnp.float32)
    dt_BxLxI = jax.nn.softplus(dt_BxLxI + self.dt_bias_I[...])
    # A padded step is the identity: exp(0 A) = 1, 0 B x = 0.
    dt_BxLxI = jnp.where(keep_BxLx1, dt_BxLxI, 0.0)
    a_IxN = -jnp.exp(self.a_log_IxN[...])
    return u_BxLxI, dt_BxLxI, a_IxN, b_BxLxN, c_BxLxN


@register('mamba')
class Mamba(SequenceMixer):
  """Mamba's selective-SSM mixer (causal, or bidirectional by two scans)."""

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
    state_size=16,
    conv_width=4,
    dt_rank=0,
    dt_min=0.001,
    dt_max=0.1,
    chunk_size=64,
  ):
    """Args (own options):
    expand: inner channels I = expand * emb_dim.
    state_size: N, states per channel.
    conv_width: K, the causal depthwise conv's width.
    dt_rank: R, the rank of the dt projection; 0: ceil(emb_dim / 16).
    dt_min, dt_max: range of the initial dt (log-uniform).
    chunk_size: positions per scan chunk (>= L: one unchunked scan).
    """
    del num_heads, max_length, dropout_rate, layer_index
    expand = int_option('mamba', 'expand', expand, 1, 2)
    state = int_option('mamba', 'state_size', state_size, 1, 16)
    width = int_option('mamba', 'conv_width', conv_width, 1, 4)
    rank = int_option('mamba', 'dt_rank', dt_rank, 0, 0) or math.ceil(
      emb_dim / 16
    )
    self.chunk_size = int_option('mamba', 'chunk_size', chunk_size, 1, 64)
    dt_min, dt_max = step_range_option('mamba', dt_min, dt_max)
    inner = expand * emb_dim
    self.inner, self.num_states, self.conv_width = inner, state, width
    self.dtype = dtype
    linear = lambda i, o: nnx.Linear(  # noqa: E731
      i, o, use_bias=False, kernel_init=TORCH_LINEAR, dtype=dtype, rngs=rngs
    )
    self.in_proj = linear(emb_dim, 2 * inner)
    direction = lambda: MambaDirection(  # noqa: E731
      inner, state, rank, width, dt_min, dt_max, dtype, rngs
    )
    self.fwd = direction()
    self.bwd = direction()
    self.out_proj = linear(inner, emb_dim)

  def state_size(self):
    """I N SSM states + I (K - 1) conv inputs per example (one direction,
    as for causal recurrent inference)."""
    return self.inner * (self.num_states + self.conv_width - 1)

  def __call__(self, x_BxLxE, mask, *, rngs=None):
    del rngs
    b, length, _ = x_BxLxE.shape
    real = real_BxL(mask, b, length)
    xz_BxLx2I = self.in_proj(zero_padded(x_BxLxE, mask).astype(self.dtype))
    xz_BxLx2I = xz_BxLx2I.astype(jnp.float32)
    x_BxLxI = jnp.where(real[:, :, None], xz_BxLx2I[..., : self.inner], 0.0)
    z_BxLxI = xz_BxLx2I[..., self.inner :]
    flip = lambda t: t[:, ::-1]  # noqa: E731
    directions = [(self.fwd, x_BxLxI, real)]
    if not mask.causal:
      directions.append((self.bwd, flip(x_BxLxI), flip(real)))
    # Both directions in one scan: inputs stacked as [G, B, L, .].
    per_direction = [d.scan_inputs(x, r) for d, x, r in directions]
    u, dt, a, bm, cm = (jnp.stack(t) for t in zip(*per_direction))
    y_GxBxLxI = selective_scan(u, dt, a[:, None], bm, cm, self.chunk_size)
    y_GxBxLxI = (
      y_GxBxLxI
      + jnp.stack([d.d_I[...] for d, _, _ in directions])[:, None, None] * u
    )
    y_BxLxI = y_GxBxLxI[0]
    if not mask.causal:
      y_BxLxI = y_BxLxI + flip(y_GxBxLxI[1])
    y_BxLxI = y_BxLxI * jax.nn.silu(z_BxLxI)
    out_BxLxE = self.out_proj(y_BxLxI.astype(self.dtype))
    out_BxLxE = jnp.where(real[:, :, None], out_BxLxE, 0)
    return out_BxLxE.astype(x_BxLxE.dtype), {}
