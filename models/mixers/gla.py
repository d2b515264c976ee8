"""GLA: gated linear attention, in its chunk-wise parallel form.

Yang, Wang, Shen, Panda, Kim, "Gated Linear Attention Transformers with
Hardware-Efficient Training" (arXiv 2312.06635), sections 4.1-4.3. With H
heads of key width K = expand_k E / H and value width V = expand_v E / H:
  q_t, k_t, v_t = x_t W_q, x_t W_k, x_t W_v      E -> H K, H K, H V (no bias)
  log alpha_t = logsigmoid(x_t W_1 W_2 + b) / tau   E -> R -> H K, tau = 16
  S_t = diag(alpha_t) S_(t-1) + k_t^T v_t         per head, S_t [K, V], S_-1 = 0
  o_t = (q_t / sqrt(K)) S_t                       per head, [V]
  out = out_proj(RMSNorm_head(o_t) (.) w (.) swish(x_t W_r))    H V -> E
i.e. alpha_t = sigmoid(x_t W_1 W_2 + b)^(1/tau), a data-dependent decay per
key channel from a rank-R gate (R = gate_low_rank_dim), and the RMSNorm
taken over each head's V channels (weight w [V] shared by the heads).

Chunked form (section 4.2): positions cut into chunks of C = chunk_size; in
a chunk, b_j = log alpha_1 + .. + log alpha_j (j = 1 .. C, cumulative from
the chunk's start, float32, <= 0) and S the state entering it:
  o_j = (q_j (.) e^(b_j)) S + sum_(l<=j) [sum_d q_jd k_ld e^(b_jd - b_ld)] v_l
  S' = e^(b_C) (.) S + sum_l (k_l (.) e^(b_C - b_l))^T v_l
a jax.lax.scan over the chunks carries the [K, V] state. Every exponent
here is <= 0, so nothing overflows, except in the matmul form of the
intra-chunk scores, (q e^b)(k e^-b)^T, whose e^(-b) would (b reaches -500
in a chunk of strongly forgetting gates). Hence the paper's secondary
chunking (section 4.3; the authors' fla/ops/gla/chunk.py): sub-chunks of
c = gcd(C, 16) positions; for a query in sub-chunk s and a key in an
earlier one, e^(b_j - b_l) = e^(b_j - r_s) e^(r_s - b_l) with r_s the b
just before sub-chunk s (both factors <= 1: one [c, K] x [K, C] matmul per
sub-chunk); keys in the query's own sub-chunk are scored elementwise
([c, c, K] per sub-chunk, exponents b_j - b_l <= 0). The differences b_j -
b_l of cumulative sums lose about eps |b_C| absolutely (chunk-local, so
|b_C| stays small unless the gates forget everything anyway).

Cost per head and example: time O(L C (K + V) + L K V + L c K); memory O(L
(K + V) + (L / C) K V + C (C + c K)): the inputs, one [K, V] state per
chunk for the backward pass and one chunk's scores at a time (the chunk
step is rematerialised, jax.checkpoint); no [L, L] array. State per
example (recurrent inference) H K V numbers. Gates, cumulative sums,
exponentials, the chunk matmuls (precision HIGHEST), the state and the
norm in float32 whatever the compute dtype; the projections in the compute
dtype.

Exact limit (tests/test_mixer_gla.py): with every alpha_t = 1 the chunked
form is unnormalised causal linear attention, o_t = q_t sum_(s<=t) k_s^T
v_s / sqrt(K), checked against the direct float64 sum; and the module
equals the recurrence above run step by step in float64 (causal and
bidirectional, with padding, any chunk size).

Non-causal masks (bidirectional): a second gate (W_1, W_2, b) runs the same
recurrence over the reversed sequence (a plain flip, as mamba.py: padding
then comes first and, being identity steps, leaves the zero state alone);
q, k, v, the norm, the output gate and out_proj are shared, and the two
directions are summed before the norm, out = out_proj(RMSNorm(o_fwd +
reverse(o_bwd)) (.) w (.) swish(x W_r)); the present token is read by both.
Every instance holds both gates; a causal model leaves the backward one
alone.

Padding (beyond the builder's zeroed inputs): q, k, v have no bias, so k_t
= v_t = 0 at padded steps, and log alpha_t is set to 0 there: a padded
step is the identity on the state wherever it is (and so is the tail
padding of L to a multiple of C). The output is multiplied by the real
mask; an all-padded example gives zeros (the norm of 0 is 0, eps > 0).

Initialisation as the authors (fla-org/flash-linear-attention: the layer
fla/layers/gla.py, the model's _init_weights in fla/models/gla/
modeling_gla.py, the config fla/models/gla/configuration_gla.py): every
linear kernel N(0, initializer_range = 0.02), the gate's bias 0 (the
logits start near 0, alpha near 2^(-1/16) = 0.958 per step), the norm's
weight 1, norm eps 1e-6 (the config's norm_eps), q scaled by K^-1/2
(chunk_gla's default scale, fla/ops/gla/naive.py), the gate
logsigmoid(.) / gate_logit_normalizer.

Options (`model.attention.<option>`): expand_k (0.5, as the paper), expand_v
(1), chunk_size (C, 64), gate_low_rank_dim (R, 16), gate_logit_normalizer
(tau, 16), initializer_range (0.02); num_heads is the model's.

Deliberate differences from the authors' code: the chunked form in XLA
einsums and a lax.scan, not their Triton kernels (same recurrence, float32
state); no short convolution (the authors' default is off too; the harness
has model.short_conv), no feature map, no clamp_min (their defaults), no
key/value head sharing (num_kv_heads); no dropout (GLA has none:
dropout_rate is accepted and ignored); the bidirectional form above is not
in the paper.

Shape names: H heads, K key width and V value width per head, R gate rank,
C chunk, c sub-chunk, N sub-chunks per chunk, G directions, X rows (any
leading dims: directions, batch, heads).
"""

import math

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from models.attention.base import int_option
from models.attention.registry import register
from models.errors import UserError
from models.mixers.base import SequenceMixer, real_BxL, zero_padded

_F32 = jnp.float32
_HIGHEST = jax.lax.Precision.HIGHEST
# The authors' config: norm_eps (the output RMSNorm).
NORM_EPS = 1e-6
# Secondary chunk length (the authors' kernels' BC): at most this many
# positions are scored elementwise.
SUB_CHUNK = 16


def _einsum(spec, *operands):
  return jnp.einsum(spec, *operands, precision=_HIGHEST)


# Helpers deltanet.py shares.


def positive_option(core, name, value, example):
  """value as a float if it is a number > 0, else one sentence."""
  ok = isinstance(value, (int, float, np.integer, np.floating))
  if ok and not isinstance(value, bool) and 0 < value < math.inf:
    return float(value)
  raise UserError(
    f'{core} {name} must be a number > 0, got {value!r}; set e.g. '
    f'--config.model.attention.{name}={example}.'
  )


def head_width(core, name, expand, emb_dim, heads, example):
  """Per-head width int(expand * emb_dim) / heads, checked (one sentence
  when expand is not a positive number or heads do not divide the width)."""
  width = int(emb_dim * positive_option(core, name, expand, example))
  if width < heads or width % heads:
    raise UserError(
      f'{core} {name}={expand!r} gives a width of {width} (int({name} * '
      f'emb_dim), emb_dim {emb_dim}), which {heads} heads do not divide; set '
      f'e.g. --config.model.attention.{name}={example}.'
    )
  return width // heads


def normal_linear(fan_in, fan_out, std, dtype, rngs, bias=False):
  """The authors' nn.Linear after _init_weights: kernel N(0, std), bias 0."""
  return nnx.Linear(
    fan_in,
    fan_out,
    use_bias=bias,
    kernel_init=nnx.initializers.normal(std),
    bias_init=nnx.initializers.zeros,
    dtype=dtype,
    rngs=rngs,
  )


def head_rms_norm(o_XxV, weight_V):
  """RMSNorm over the last axis (a head's channels), eps NORM_EPS, float32."""
  o_XxV = o_XxV.astype(_F32)
  ms_Xx1 = jnp.mean(jnp.square(o_XxV), axis=-1, keepdims=True)
  return o_XxV * jax.lax.rsqrt(ms_Xx1 + NORM_EPS) * weight_V


def chunk_scan(step, state, xs, chunk):
  """The outputs of `step` over chunks of min(chunk, L) positions.

  xs: arrays [X, L, ...] (L padded at the end with zeros, which the
  callers' steps treat as identity steps); step(state, chunk_xs) ->
  (state, out [X, C, ...]) on chunk_xs [X, C, ...]. One chunk: step alone;
  more: a jax.lax.scan over the chunks with the step rematerialised (the
  backward pass keeps one state per chunk). Returns out [X, L, ...].
  """
  length = xs[0].shape[1]
  c = min(chunk, length)
  n = -(-length // c)

  def chunks(t):  # [X, L, ...] -> [n, X, C, ...]
    t = jnp.pad(t, ((0, 0), (0, n * c - length)) + ((0, 0),) * (t.ndim - 2))
    return jnp.moveaxis(t.reshape((t.shape[0], n, c) + t.shape[2:]), 1, 0)

  xs = tuple(chunks(t) for t in xs)
  if n == 1:
    out = step(state, tuple(t[0] for t in xs))[1][None]
  else:
    out = jax.lax.scan(jax.checkpoint(step), state, xs)[1]
  out = jnp.moveaxis(out, 0, 1)  # [X, n, C, ...]
  return out.reshape((out.shape[0], n * c) + out.shape[3:])[:, :length]


def gla_chunk_step(s_XxKxV, xs, sub=SUB_CHUNK):
  """One chunk of GLA: the entering state and (q, k, v, log alpha) [X, C,
  .] float32 -> (the leaving state, o [X, C, V])."""
  q_XxCxK, k_XxCxK, v_XxCxV, g_XxCxK = xs
  rows, c, kd = q_XxCxK.shape
  sub = math.gcd(c, sub)
  n = c // sub
  b_XxCxK = jnp.cumsum(g_XxCxK, axis=1)
  # The entering state, decayed to each position.
  o_XxCxV = _einsum('xck,xkv->xcv', q_XxCxK * jnp.exp(b_XxCxK), s_XxKxV)
  # Keys in earlier sub-chunks: via r_s, the b just before sub-chunk s.
  bs_XxNxcxK = b_XxCxK.reshape(rows, n, sub, kd)
  qs_XxNxcxK = q_XxCxK.reshape(rows, n, sub, kd)
  ks_XxNxcxK = k_XxCxK.reshape(rows, n, sub, kd)
  r_XxNxK = jnp.concatenate(
    [jnp.zeros((rows, 1, kd), _F32), bs_XxNxcxK[:, :-1, -1]], axis=1
  )
  qr_XxNxcxK = qs_XxNxcxK * jnp.exp(bs_XxNxcxK - r_XxNxK[:, :, None])
  earlier_NxC = jnp.arange(c)[None, :] < sub * jnp.arange(n)[:, None]
  earlier_NxCx1 = earlier_NxC[..., None]
  to_r_XxNxCxK = jnp.where(
    earlier_NxCx1, r_XxNxK[:, :, None] - b_XxCxK[:, None], 0.0
  )
  kr_XxNxCxK = jnp.where(
    earlier_NxCx1, k_XxCxK[:, None] * jnp.exp(to_r_XxNxCxK), 0.0
  )
  a_XxCxC = _einsum('xnik,xnlk->xnil', qr_XxNxcxK, kr_XxNxCxK).reshape(
    rows, c, c
  )
  # Keys in the query's own sub-chunk: elementwise.
  tril_cxcx1 = jnp.tril(jnp.ones((sub, sub), bool))[..., None]
  diff_XxNxcxcxK = jnp.where(
    tril_cxcx1, bs_XxNxcxK[:, :, :, None] - bs_XxNxcxK[:, :, None], 0.0
  )
  decay_XxNxcxcxK = jnp.where(tril_cxcx1, jnp.exp(diff_XxNxcxcxK), 0.0)
  own_XxNxcxc = _einsum(
    'xnik,xnlk,xnilk->xnil', qs_XxNxcxK, ks_XxNxcxK, decay_XxNxcxcxK
  )
  own_XxCxC = _einsum('xnil,nm->xniml', own_XxNxcxc, jnp.eye(n, dtype=_F32))
  a_XxCxC = a_XxCxC + own_XxCxC.reshape(rows, c, c)
  o_XxCxV = o_XxCxV + _einsum('xcl,xlv->xcv', a_XxCxC, v_XxCxV)
  # The state leaving the chunk.
  b_XxK = b_XxCxK[:, -1]
  kb_XxCxK = k_XxCxK * jnp.exp(b_XxK[:, None] - b_XxCxK)
  s_XxKxV = jnp.exp(b_XxK)[..., None] * s_XxKxV + _einsum(
    'xck,xcv->xkv', kb_XxCxK, v_XxCxV
  )
  return s_XxKxV, o_XxCxV


def gla_chunked(q_XxLxK, k_XxLxK, v_XxLxV, g_XxLxK, chunk, sub=SUB_CHUNK):
  """o_t = q_t S_t, S_t = diag(exp(g_t)) S_(t-1) + k_t^T v_t, S_-1 = 0, for
  rows X (g the log-decays, <= 0), in chunks of min(chunk, L) positions
  and sub-chunks of gcd(C, sub). float32 [X, L, V]."""
  q_XxLxK, k_XxLxK, v_XxLxV, g_XxLxK = (
    t.astype(_F32) for t in (q_XxLxK, k_XxLxK, v_XxLxV, g_XxLxK)
  )
  rows, _, kd = q_XxLxK.shape
  s_XxKxV = jnp.zeros((rows, kd, v_XxLxV.shape[-1]), _F32)

  def step(s, xs):
    return gla_chunk_step(s, xs, sub)

  return chunk_scan(step, s_XxKxV, (q_XxLxK, k_XxLxK, v_XxLxV, g_XxLxK), chunk)


class GLAGate(nnx.Module):
  """The low-rank decay gate of one direction: x W_1 W_2 + b."""

  def __init__(self, emb_dim, rank, key_dim, std, dtype, rngs):
    self.down = normal_linear(emb_dim, rank, std, dtype, rngs)
    self.up = normal_linear(rank, key_dim, std, dtype, rngs, bias=True)

  def log_decay(self, x_BxLxE, tau):
    """log alpha = logsigmoid(x W_1 W_2 + b) / tau, float32 [B, L, H K]."""
    logits = self.up(self.down(x_BxLxE)).astype(_F32)
    return jax.nn.log_sigmoid(logits) / tau


@register('gla')
class GLA(SequenceMixer):
  """Gated linear attention (causal, or bidirectional by two passes)."""

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
    expand_k=0.5,
    expand_v=1.0,
    chunk_size=64,
    gate_low_rank_dim=16,
    gate_logit_normalizer=16,
    initializer_range=0.02,
  ):
    """Args (own options):
    expand_k: key width H K = int(expand_k * emb_dim).
    expand_v: value width H V = int(expand_v * emb_dim).
    chunk_size: C, positions per chunk of the parallel form.
    gate_low_rank_dim: R, the rank of the decay gate.
    gate_logit_normalizer: tau, log alpha = logsigmoid(.) / tau.
    initializer_range: the std of every linear kernel.
    """
    del max_length, dropout_rate, layer_index
    name = 'gla'
    h = int_option(name, 'num_heads', num_heads, 1, 8)
    self.key_width = head_width(name, 'expand_k', expand_k, emb_dim, h, 0.5)
    self.value_width = head_width(name, 'expand_v', expand_v, emb_dim, h, 1)
    self.chunk_size = int_option(name, 'chunk_size', chunk_size, 1, 64)
    rank = int_option(name, 'gate_low_rank_dim', gate_low_rank_dim, 1, 16)
    self.tau = positive_option(
      name, 'gate_logit_normalizer', gate_logit_normalizer, 16
    )
    std = positive_option(name, 'initializer_range', initializer_range, 0.02)
    self.num_heads, self.dtype = h, dtype
    kd, vd = h * self.key_width, h * self.value_width
    linear = lambda i, o: normal_linear(i, o, std, dtype, rngs)  # noqa: E731
    self.q_proj = linear(emb_dim, kd)
    self.k_proj = linear(emb_dim, kd)
    self.v_proj = linear(emb_dim, vd)
    self.g_proj = linear(emb_dim, vd)
    self.fwd = GLAGate(emb_dim, rank, kd, std, dtype, rngs)
    self.bwd = GLAGate(emb_dim, rank, kd, std, dtype, rngs)
    self.norm_V = nnx.Param(jnp.ones((self.value_width,), _F32))
    self.o_proj = linear(vd, emb_dim)

  def state_size(self):
    """H K V numbers per example (one direction)."""
    return self.num_heads * self.key_width * self.value_width

  def __call__(self, x_BxLxE, mask, *, rngs=None):
    del rngs
    b, length, _ = x_BxLxE.shape
    h, kd, vd = self.num_heads, self.key_width, self.value_width
    real = real_BxL(mask, b, length)
    xc_BxLxE = zero_padded(x_BxLxE, mask).astype(self.dtype)

    def heads(t, width):  # [B, L, H W] -> [B, H, L, W] float32
      return jnp.swapaxes(t.astype(_F32).reshape(b, length, h, width), 1, 2)

    q = heads(self.q_proj(xc_BxLxE), kd) * kd**-0.5
    k = heads(self.k_proj(xc_BxLxE), kd)
    v = heads(self.v_proj(xc_BxLxE), vd)
    gates = [self.fwd] if mask.causal else [self.fwd, self.bwd]
    # A padded step is the identity: alpha = 1 (k = v = 0 already).
    g_GxBxHxLxK = jnp.stack(
      [
        jnp.where(
          real[:, None, :, None],
          heads(gate.log_decay(xc_BxLxE, self.tau), kd),
          0.0,
        )
        for gate in gates
      ]
    )
    flip = lambda t: t[..., ::-1, :]  # noqa: E731  along L
    if len(gates) == 2:
      q, k, v = (jnp.stack([t, flip(t)]) for t in (q, k, v))
      g_GxBxHxLxK = jnp.stack([g_GxBxHxLxK[0], flip(g_GxBxHxLxK[1])])
    else:
      q, k, v = (t[None] for t in (q, k, v))
    lead = g_GxBxHxLxK.shape[:3]
    rows = lambda t: t.reshape((-1,) + t.shape[3:])  # noqa: E731
    o_XxLxV = gla_chunked(
      rows(q), rows(k), rows(v), rows(g_GxBxHxLxK), self.chunk_size
    )
    o_GxBxHxLxV = o_XxLxV.reshape(lead + (length, vd))
    o_BxHxLxV = o_GxBxHxLxV[0]
    if len(gates) == 2:
      o_BxHxLxV = o_BxHxLxV + flip(o_GxBxHxLxV[1])
    o_BxLxHxV = head_rms_norm(jnp.swapaxes(o_BxHxLxV, 1, 2), self.norm_V[...])
    r_BxLxHxV = self.g_proj(xc_BxLxE).astype(_F32).reshape(b, length, h, vd)
    o_BxLxF = (o_BxLxHxV * jax.nn.silu(r_BxLxHxV)).reshape(b, length, h * vd)
    out_BxLxE = self.o_proj(o_BxLxF.astype(self.dtype))
    out_BxLxE = jnp.where(real[:, :, None], out_BxLxE, 0)
    return out_BxLxE.astype(x_BxLxE.dtype), {}
