"""RetNet's retention as an attention core, in its chunkwise form.

Sun et al., "Retentive Network: A Successor to Transformer for Large
Language Models" (arXiv 2307.08621), sections 2.1-2.2. Per head h, with a
fixed decay gamma_h in (0, 1):
  recurrent:  S_n = gamma S_(n-1) + k_n^T v_n,   o_n = q_n S_n
  parallel:   O = (Q K^T (.) Dm) V,  Dm[n, m] = gamma^(n - m) if n >= m else 0
  chunkwise (chunks of C positions, R_i the state after chunk i):
    O_[i] = (Q_[i] K_[i]^T (.) Dm_C) V_[i] + gamma^(j + 1) Q_[i] R_(i-1)
    R_i   = gamma^C R_(i-1) + K_[i]^T (gamma^(C - 1 - j) V_[i])
  (j the row inside the chunk). The three forms are equal; this core runs
the chunkwise one: a C x C masked form inside a chunk, a carried [D, D]
state per head across chunks (jax.lax.scan, the body rematerialised).
Time O(L C D + L D^2) per head; memory O(L D + C^2) live, and L / C states
[D, D] kept for the backward pass. No L x L array beyond a chunk.

Decays (option `decay`):
  'paper'   gamma_h = 1 - 2^(-5 - h), h = 0 .. H-1 (section 2.2, the
            multi-scale retention; torchscale's default): memory horizons
            1 / (1 - gamma) = 32, 64, .., 2^(4 + H) positions;
  'spaced'  gamma_h = 1 - exp(linspace(log 1/32, log 1/512, H)): horizons
            32 .. 512, log-uniform over any number of heads (the
            alternative some RetNet implementations offer, e.g. as a
            `use_lm_decay` option).
log(gamma) is computed in float64 at construction (log1p), so gamma^t =
exp(t log gamma) stays exact in float32 for many heads.

Normalisation (section 2.2, kept as the paper's): q . k is scaled by
1/sqrt(D); the decay row n is divided by sqrt(sum_m Dm[n, m]) over the
visible keys m; the scores row n by max(|sum_m R[n, m]|, 1) with R = Q K^T
(.) Dm~ (the sum kept as a signed sum, as in the paper and the authors'
parallel form, so that it is a retention of its own: v gets a column of
ones); then GroupNorm over each head's D outputs (no affine: the output
projection follows, and the authors' later code drops it too; eps 1e-6;
option `group_norm`). Each of these scales a whole output row, so with
GroupNorm they only stabilise the sums; with group_norm=False the output is
the score-normalised retention.

Causal masks: the recurrence above. Non-causal masks: bidirectional
retention with the two-sided decay gamma^|n - m|, computed as the causal
chunkwise pass plus the same pass over the reversed sequence minus the
diagonal (q_n . k_n) v_n counted twice; the normalisers likewise.

Padding: keys and values at padded positions are zeroed (they contribute
nothing to any sum, also after the reversal, since the decay depends on
the distance only); a query with no visible key (models/attention/base.py)
gets zeros; sums, decays and GroupNorm in float32 whatever the compute
dtype; output in the compute dtype.

Rotary: 'scores'. Every score is q_n . k_m times a decay that depends on
n - m only, so rotated q and k give (R_n q_n)^T (R_m k_m) gamma^(n-m) =
q_n^T R_(m-n) k_m gamma^(n-m): with --config.model.positions=rotary this
is the paper's retention with its xPos-like rotation Theta_n = e^(i n
theta) (section 2.1). Without it no rotation is applied: positions are the
harness's business (model.positions), not the core's.

Deliberate differences from the paper and torchscale: no swish gate (the
gate swish(X W_G) of the MSR layer, section 2.2, is a projection of the
block's input, which a core does not see; MultiHeadAttention's output
projection is W_O); keys and values share the head dim D of the harness
(torchscale lets the values be wider, value_dim != embed_dim); GroupNorm
has no affine parameters; the chunk boundary normalisation of torchscale's
chunkwise code (a clamp of the state's abs sums) is replaced by the exact
normalisers above, so the chunkwise form equals the parallel form at any
chunk size; no dropout (retention has no attention weights: dropout_rate is
ignored)."""

import math

import jax
import jax.numpy as jnp
import numpy as np

from models.attention.base import (
  AttentionCore,
  bool_option,
  int_option,
  key_valid_BxM,
  pad_to_multiple,
  visible_any_BxL,
)
from models.attention.registry import register
from models.errors import UserError

DECAYS = ('paper', 'spaced')
# GroupNorm's epsilon (the authors' layernorm_eps).
EPS = 1e-6
# A decay row sum below this counts as "no visible key".
TINY = 1e-30


def log_gammas(num_heads, decay='paper'):
  """float64 [H]: log(gamma_h) of the named decay rule."""
  if decay == 'paper':
    one_minus_H = 2.0 ** (-5.0 - np.arange(num_heads, dtype=np.float64))
  elif decay == 'spaced':
    log_ends = math.log(1 / 32), math.log(1 / 512)
    one_minus_H = np.exp(np.linspace(*log_ends, num_heads))
  else:
    raise UserError(
      f'retnet decay must be one of {", ".join(DECAYS)}, got {decay!r}; '
      'set e.g. --config.model.attention.decay=paper.'
    )
  return np.log1p(-one_minus_H)


def causal_retention(q_BxLxHxK, k_BxLxHxK, v_BxLxHxV, log_gamma_H, chunk):
  """sum_(m <= n) gamma_h^(n - m) (q_n . k_m) v_m, float32 [B, L, H, V].

  The chunkwise form: chunks of C = min(chunk, L) positions (L padded with
  zeros to a multiple of C), a C x C decayed quadratic form inside a chunk
  and a [B, H, K, V] state carried across chunks by jax.lax.scan, its body
  rematerialised (the backward pass keeps one state per chunk).
  """
  b, length, h, kd = q_BxLxHxK.shape
  vd = v_BxLxHxV.shape[-1]
  c = min(chunk, length)
  n = -(-length // c)
  f32 = lambda t: t.astype(jnp.float32)  # noqa: E731

  def chunks(t):  # [B, n*C, H, X] -> [n, B, C, H, X]
    t = pad_to_multiple(f32(t), c, axis=1)
    return jnp.moveaxis(t.reshape(b, n, c, h, t.shape[-1]), 1, 0)

  lg_H = jnp.asarray(log_gamma_H, jnp.float32)
  j_C = jnp.arange(c, dtype=jnp.float32)
  dist_CxC = j_C[:, None] - j_C[None, :]
  # gamma^(i - j) for i >= j, else 0; the exponent is clamped so that the
  # masked entries never overflow.
  decay_HxCxC = jnp.where(
    dist_CxC >= 0, jnp.exp(jnp.maximum(dist_CxC, 0) * lg_H[:, None, None]), 0
  )
  q_decay_CxH = jnp.exp((j_C[:, None] + 1) * lg_H)  # state -> query j
  k_decay_CxH = jnp.exp((c - 1 - j_C[:, None]) * lg_H)  # key j -> chunk end
  chunk_decay_H = jnp.exp(c * lg_H)

  @jax.checkpoint
  def step(s_BxHxKxV, xs):
    q_BxCxHxK, k_BxCxHxK, v_BxCxHxV = xs
    a_BxHxCxC = jnp.einsum('bihk,bjhk->bhij', q_BxCxHxK, k_BxCxHxK)
    a_BxHxCxC = a_BxHxCxC * decay_HxCxC
    inner_BxCxHxV = jnp.einsum('bhij,bjhv->bihv', a_BxHxCxC, v_BxCxHxV)
    cross_BxCxHxV = jnp.einsum(
      'bihk,bhkv->bihv', q_BxCxHxK * q_decay_CxH[:, :, None], s_BxHxKxV
    )
    s_BxHxKxV = s_BxHxKxV * chunk_decay_H[:, None, None] + jnp.einsum(
      'bjhk,bjhv->bhkv', k_BxCxHxK * k_decay_CxH[:, :, None], v_BxCxHxV
    )
    return s_BxHxKxV, inner_BxCxHxV + cross_BxCxHxV

  init = jnp.zeros((b, h, kd, vd), jnp.float32)
  xs = (chunks(q_BxLxHxK), chunks(k_BxLxHxK), chunks(v_BxLxHxV))
  _, o_NxBxCxHxV = jax.lax.scan(step, init, xs)
  o_BxLxHxV = jnp.moveaxis(o_NxBxCxHxV, 0, 1).reshape(b, n * c, h, vd)
  return o_BxLxHxV[:, :length]


def retention(q_BxLxHxK, k_BxLxHxK, v_BxLxHxV, log_gamma_H, *, causal, chunk):
  """Causal: causal_retention. Non-causal: the two-sided decay
  gamma^|n - m|, a forward plus a reversed causal pass minus the diagonal."""
  fwd = causal_retention(q_BxLxHxK, k_BxLxHxK, v_BxLxHxV, log_gamma_H, chunk)
  if causal:
    return fwd
  flip = lambda t: t[:, ::-1]  # noqa: E731
  bwd = flip(
    causal_retention(
      flip(q_BxLxHxK), flip(k_BxLxHxK), flip(v_BxLxHxV), log_gamma_H, chunk
    )
  )
  qk_BxLxH = jnp.sum(
    q_BxLxHxK.astype(jnp.float32) * k_BxLxHxK.astype(jnp.float32), axis=-1
  )
  return fwd + bwd - qk_BxLxH[..., None] * v_BxLxHxV.astype(jnp.float32)


def group_norm(o_BxLxHxD):
  """GroupNorm with one group per head, no affine, float32."""
  mean = jnp.mean(o_BxLxHxD, axis=-1, keepdims=True)
  var = jnp.mean(jnp.square(o_BxLxHxD - mean), axis=-1, keepdims=True)
  return (o_BxLxHxD - mean) * jax.lax.rsqrt(var + EPS)


@register('retnet')
class RetNetAttention(AttentionCore):
  """Multi-scale retention (one decay per head), chunkwise."""

  supports_causal = True
  rotary = 'scores'

  def __init__(
    self,
    *,
    num_heads,
    head_dim,
    max_length,
    dropout_rate,
    dtype,
    rngs,
    layer_index=0,
    chunk_size=64,
    decay='paper',
    group_norm=True,
  ):
    """Args (own options):
    chunk_size: positions per chunk of the chunkwise form (any >= 1;
      the result does not depend on it).
    decay: 'paper' (gamma_h = 1 - 2^(-5-h)) or 'spaced' (see module doc).
    group_norm: GroupNorm per head of the output (the paper's).
    """
    del max_length, dropout_rate, rngs, layer_index
    self.chunk_size = int_option('retnet', 'chunk_size', chunk_size, 1, 64)
    # A tuple of floats: static, not a parameter (gamma is fixed).
    self.log_gamma = tuple(float(g) for g in log_gammas(num_heads, decay))
    self.decay = decay
    self.group_norm = bool_option('retnet', 'group_norm', group_norm)
    self.num_heads = num_heads
    self.head_dim = head_dim
    self.dtype = dtype

  def state_size(self):
    """Numbers of recurrent state per example: S [H, D, D], the score
    normaliser's [H, D] and the decay normaliser's [H]."""
    h, d = self.num_heads, self.head_dim
    return h * d * d + h * d + h

  def __call__(
    self, q_BxLxHxD, k_BxMxHxD, v_BxMxHxD, mask, *, rngs=None, memory=None
  ):
    del rngs, memory
    b, length, h, d = q_BxLxHxD.shape
    if k_BxMxHxD.shape[1] != length:
      raise ValueError('retnet needs as many keys as queries (self-attention)')
    real_BxL = key_valid_BxM(mask, b, length)
    real_BxLx1x1 = real_BxL[:, :, None, None].astype(jnp.float32)
    q_BxLxHxD = q_BxLxHxD.astype(jnp.float32) * d**-0.5
    k_BxLxHxD = k_BxMxHxD.astype(jnp.float32) * real_BxLx1x1
    v_BxLxHxD = v_BxMxHxD.astype(jnp.float32) * real_BxLx1x1
    run = lambda q, k, v: retention(  # noqa: E731
      q, k, v, self.log_gamma, causal=mask.causal, chunk=self.chunk_size
    )
    # v with a column of ones: its output column is the scores' row sum.
    ones_BxLxHx1 = jnp.ones((b, length, h, 1), jnp.float32)
    out_BxLxHxV = run(
      q_BxLxHxD,
      k_BxLxHxD,
      jnp.concatenate([v_BxLxHxD, ones_BxLxHx1 * real_BxLx1x1], -1),
    )
    num_BxLxHxD, rowsum_BxLxHx1 = out_BxLxHxV[..., :d], out_BxLxHxV[..., d:]
    # sum_m gamma^(n-m) over the visible keys: a retention of ones.
    decay_sum_BxLxHx1 = run(
      ones_BxLxHx1, jnp.broadcast_to(real_BxLx1x1, (b, length, h, 1)),
      ones_BxLxHx1,
    )  # fmt: skip
    ok_BxLxHx1 = decay_sum_BxLxHx1 > TINY
    scale_BxLxHx1 = jnp.where(
      ok_BxLxHx1, jax.lax.rsqrt(jnp.where(ok_BxLxHx1, decay_sum_BxLxHx1, 1)), 0
    )
    den_BxLxHx1 = jnp.maximum(jnp.abs(rowsum_BxLxHx1 * scale_BxLxHx1), 1.0)
    o_BxLxHxD = num_BxLxHxD * (scale_BxLxHx1 / den_BxLxHx1)
    if self.group_norm:
      o_BxLxHxD = group_norm(o_BxLxHxD)
    seen_BxL = visible_any_BxL(mask, b, length, length)
    o_BxLxHxD = jnp.where(seen_BxL[:, :, None, None], o_BxLxHxD, 0.0)
    return o_BxLxHxD.astype(self.dtype), {}
