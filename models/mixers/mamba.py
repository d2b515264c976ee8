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

The scan: h_t is a linear recurrence, so (a_t, b_t) = (exp(dt_t A),
dt_t B_t x_t) compose associatively, (a1, b1) then (a2, b2) = (a1 a2,
a2 b1 + b2). L is split into chunks of C = chunk_size positions: inside a
chunk jax.lax.associative_scan, across chunks a carried state [B, I, N]
(jax.lax.scan), the chunk body rematerialised (jax.checkpoint): the
backward pass keeps one [B, I, N] state per chunk and recomputes one
chunk's [B, C, I, N] states at a time, never [B, L, I, N] (chunk_size >= L:
one chunk, no remat, the unchunked form). Time O(L I N) (the associative
scan is work-efficient; depth O(log C) inside a chunk, L / C chunks one
after the other), memory O(L I + (L / C) I N + C I N) per example; state
per example (recurrent inference) I N + I (K - 1) numbers. Scan,
exponentials, conv and sums in float32; the projections in the compute
dtype.

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
scan is jax.lax.associative_scan in remat'd chunks, not the fused CUDA
kernel (same recurrence, same float32 state); in_proj, x_proj and out_proj
use flax's dtype handling (kernels float32, matmuls in the compute dtype);
no residual rescaling of out_proj by the depth (the block's business); no
dropout (Mamba has none: dropout_rate is accepted and ignored); the
bidirectional variant above is not in the Mamba paper.

Shape names: I inner channels, N states, R dt rank, K conv width, C chunk.
"""

import math

from flax import nnx
import jax
import jax.numpy as jnp

from errors import UserError
from models.attention.base import int_option
from models.attention.registry import register
from models.mixers.base import SequenceMixer, real_BxL, zero_padded

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


def selective_scan(u_BxLxI, dt_BxLxI, a_IxN, b_BxLxN, c_BxLxN, chunk):
  """y_t = C_t . h_t, h_t = exp(dt_t A) h_(t-1) + dt_t B_t u_t, h_-1 = 0.

  float32 [B, L, I]; chunks of min(chunk, L) positions (L padded with
  identity steps, dt = 0), associative scan inside a chunk, the state
  carried across chunks by jax.lax.scan with a rematerialised body.
  """
  f32 = lambda t: t.astype(jnp.float32)  # noqa: E731
  u_BxLxI, dt_BxLxI, b_BxLxN, c_BxLxN = map(
    f32, (u_BxLxI, dt_BxLxI, b_BxLxN, c_BxLxN)
  )
  a_IxN = f32(a_IxN)
  b, length, inner = u_BxLxI.shape
  c = min(chunk, length)
  n = -(-length // c)

  def combine(left, right):
    a_l, x_l = left
    a_r, x_r = right
    return a_l * a_r, a_r * x_l + x_r

  def body(h_BxIxN, xs):
    u_BxCxI, dt_BxCxI, b_BxCxN, c_BxCxN = xs
    a_BxCxIxN = jnp.exp(dt_BxCxI[..., None] * a_IxN)
    x_BxCxIxN = (dt_BxCxI * u_BxCxI)[..., None] * b_BxCxN[:, :, None, :]
    a_BxCxIxN, x_BxCxIxN = jax.lax.associative_scan(
      combine, (a_BxCxIxN, x_BxCxIxN), axis=1
    )
    h_BxCxIxN = a_BxCxIxN * h_BxIxN[:, None] + x_BxCxIxN
    y_BxCxI = jnp.einsum('bcin,bcn->bci', h_BxCxIxN, c_BxCxN)
    return h_BxCxIxN[:, -1], y_BxCxI

  h_BxIxN = jnp.zeros((b, inner, a_IxN.shape[-1]), jnp.float32)
  xs = (u_BxLxI, dt_BxLxI, b_BxLxN, c_BxLxN)
  if n == 1:
    return body(h_BxIxN, xs)[1]

  def chunks(t):  # [B, n*C, X] -> [n, B, C, X]; zeros are identity steps.
    t = jnp.pad(t, ((0, 0), (0, n * c - length), (0, 0)))
    return jnp.moveaxis(t.reshape(b, n, c, t.shape[-1]), 1, 0)

  _, y_NxBxCxI = jax.lax.scan(
    jax.checkpoint(body), h_BxIxN, tuple(map(chunks, xs))
  )
  return jnp.moveaxis(y_NxBxCxI, 0, 1).reshape(b, n * c, inner)[:, :length]


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

  def __call__(self, x_BxLxI, real_BxL, chunk):
    """x float32, zero at padded positions -> y float32 [B, L, I]."""
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
    y_BxLxI = selective_scan(u_BxLxI, dt_BxLxI, a_IxN, b_BxLxN, c_BxLxN, chunk)
    return y_BxLxI + self.d_I[...] * u_BxLxI


def _positive_float(name, value, example):
  if isinstance(value, bool) or not isinstance(value, (int, float)):
    ok = False
  else:
    ok = value > 0 and math.isfinite(value)
  if not ok:
    raise UserError(
      f'mamba {name} must be a positive number, got {value!r}; set e.g. '
      f'--config.model.attention.{name}={example}.'
    )
  return float(value)


@register('mamba')
class Mamba(SequenceMixer):
  """Mamba's selective-SSM mixer (causal, or bidirectional by two scans)."""

  rotary = None
  rotary_refusal = 'it is a sequence mixer, which orders tokens itself'

  supports_causal = True

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
    dt_min = _positive_float('dt_min', dt_min, 0.001)
    dt_max = _positive_float('dt_max', dt_max, 0.1)
    if dt_min > dt_max:
      raise UserError(
        f'mamba dt_min ({dt_min}) must not exceed dt_max ({dt_max}); set '
        'e.g. --config.model.attention.dt_min=0.001 and dt_max=0.1.'
      )
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
    y_BxLxI = self.fwd(x_BxLxI, real, self.chunk_size)
    if not mask.causal:
      flip = lambda t: t[:, ::-1]  # noqa: E731
      y_BxLxI = y_BxLxI + flip(
        self.bwd(flip(x_BxLxI), flip(real), self.chunk_size)
      )
    y_BxLxI = y_BxLxI * jax.nn.silu(z_BxLxI)
    out_BxLxE = self.out_proj(y_BxLxI.astype(self.dtype))
    out_BxLxE = jnp.where(real[:, :, None], out_BxLxE, 0)
    return out_BxLxE.astype(x_BxLxE.dtype), {}
