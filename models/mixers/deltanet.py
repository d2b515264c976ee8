"""DeltaNet: linear attention with the delta rule, chunked by the WY form.

Schlag, Irie, Schmidhuber, "Linear Transformers Are Secretly Fast Weight
Programmers" (arXiv 2102.11174), section 4.2; parallelised over the length
by Yang, Wang, Zhang, Shen, Kim, "Parallelizing Linear Transformers with the
Delta Rule over Sequence Length" (arXiv 2406.06484), section 3. With H heads
of key width K = expand_k E / H and value width V = expand_v E / H:
  q, k, v = SiLU(conv(x W_q)), SiLU(conv(x W_k)), SiLU(conv(x W_v))
      (no bias; conv a causal depthwise conv of width short_conv, no bias;
      short_conv 0: no conv)
  q_t, k_t = L2-normalised per head; q_t scaled by K^-1/2
  beta_t = sigmoid(x_t W_beta)                    one per head
  S_t = S_(t-1) (I - beta_t k_t^T k_t) + beta_t v_t^T k_t    S_t [V, K]
      = S_(t-1) + beta_t (v_t - S_(t-1) k_t) k_t^T
  o_t = S_t q_t                                   per head, [V]
  out = out_proj(RMSNorm_head(o_t) (.) w)         H V -> E (no bias)
(the state is kept transposed, [K, V], below: o_t = q_t S_t). Gated DeltaNet
(gated=True; Yang, Kautz, Hatamizadeh, "Gated Delta Networks: Improving
Mamba2 with Delta Rule", arXiv 2412.06464) decays the state first,
  S_t = alpha_t S_(t-1) (I - beta_t k_t^T k_t) + beta_t v_t^T k_t,
  log alpha_t = -exp(A_log) softplus(x_t W_a + dt_bias)     one per head,
and gates the output, out = out_proj(RMSNorm_head(o_t) (.) w (.) swish(x_t
W_r)), as the authors' GatedDeltaNet layer.

Chunked form (the WY / UT transform): positions cut into chunks of C =
chunk_size; in a chunk (rows j = 1 .. C), with S the entering state,
b_j = log alpha_1 + .. + log alpha_j (0 ungated), Gamma_jl = e^(b_j - b_l)
for l <= j (exponents <= 0), and the pseudo-values u_j = beta_j (v_j -
k_j alpha_j S_(j-1)) (so S_j = alpha_j S_(j-1) + k_j^T u_j), U solves
  (I + tril(diag(beta) (Gamma (.) K K^T), -1)) U = diag(beta) (V - e^b K S)
i.e. with T = (I + tril(diag(beta) (Gamma (.) K K^T), -1))^-1 diag(beta),
W = T (e^b (.) K) and U0 = T V (one unit lower triangular solve, by
ceil(log2 C) matmuls: unit_lower_solve): U = U0 - W S. Then
  O = (e^b (.) Q) S + (tril(Q K^T) (.) Gamma) U
  S' = e^(b_C) S + (e^(b_C - b) (.) K)^T U
by matmuls, and a jax.lax.scan over the chunks carries the [K, V] state.

Cost per head and example: time O(L C (K + V) + L K V); memory O(L (K + V)
+ (L / C) K V + C^2): the inputs, one [K, V] state per chunk for the
backward pass and one chunk's [C, C] matrices at a time (the chunk step is
rematerialised, jax.checkpoint); no [L, L] array. State per example
(recurrent inference) H K V numbers plus the convs' last K_conv - 1 inputs,
(K_conv - 1)(2 H K + H V). The conv, norms, gates, the solve, the chunk
matmuls (precision HIGHEST) and the state in float32 whatever the compute
dtype; the projections in the compute dtype.

Exact limits (tests/test_mixer_deltanet.py): the chunked form equals the
recurrence run step by step in float64 (any chunk size, gated or not, the
module causal and bidirectional, with padding); beta = 0 leaves the state
as it is (from the zero state: zero output).

Non-causal masks (bidirectional): a second set of convs, W_beta (and, gated,
W_a, A_log, dt_bias) runs the same recurrence over the reversed sequence
(a plain flip, as mamba.py: padding then comes first and, being identity
steps, leaves the zero state alone); the projections W_q, W_k, W_v, the
norm, the output gate and out_proj are shared, and the two directions are
summed before the norm, out = out_proj(RMSNorm(o_fwd + reverse(o_bwd)) ..);
the present token is read by both. Every instance holds both directions; a
causal model leaves the backward one alone.

Padding (beyond the builder's zeroed inputs): the convs' input is zero at
padded positions (no bias), so a conv at a real token sees zeros there as
at the start of a sequence; q, k, v are zeroed at padded positions after
the conv, beta = 0 and log alpha = 0 there: a padded step is the identity
on the state wherever it is (and so is the tail padding of L to a multiple
of C). The L2 norm is x / sqrt(|x|^2 + 1e-6) (0 at 0, as the authors'); the
output is multiplied by the real mask; an all-padded example gives zeros.

Initialisation as the authors (fla-org/flash-linear-attention: the layers
fla/layers/delta_net.py and fla/layers/gated_deltanet.py, the models'
_init_weights in fla/models/delta_net/modeling_delta_net.py and
fla/models/gated_deltanet/modeling_gated_deltanet.py, the configs'
initializer_range and norm_eps): every linear kernel and every conv kernel
(ShortConvolution is an nn.Conv1d) N(0, initializer_range = 0.02), no
biases, the norm's weight 1, eps 1e-6; the q scale K^-1/2 and the L2 norm
eps 1e-6 of their kernels (fla/ops/delta_rule/naive.py, fla/modules/
l2norm.py); gated: A = exp(A_log) ~ U(0, 16), dt_bias = softplus^-1(dt)
with dt = exp(U[log 0.001, log 0.1]) floored at 1e-4, the gate's formula
of fla/ops/gated_delta_rule/gate.py.

Options (`model.attention.<option>`): expand_k (1), expand_v (1), short_conv
(the conv width, 4; 0: none, then q, k, v are SiLU(x W) as the authors'),
chunk_size (C, 64), gated (False), initializer_range (0.02); num_heads is
the model's.

Deliberate differences from the authors' code: the chunked form in XLA
einsums, a triangular solve and a lax.scan, not their Triton kernels (same
recurrence, float32 state); qk_activation silu and qk_norm l2 only (their
defaults), no allow_neg_eigval, no output gate without gated (their
DeltaNet default use_gate=False), the gated variant keeps expand_k /
expand_v (their GatedDeltaNet sets head_dim and expand_v=2); no dropout
(dropout_rate is accepted and ignored); the bidirectional form above is in
neither paper.

Shape names: H heads, K key width and V value width per head, W conv width,
F projected channels, C chunk, G directions, X rows (directions, batch,
heads).
"""

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from models.attention.base import bool_option, int_option
from models.attention.registry import register
from models.mixers.base import (
  SequenceMixer,
  causal_conv,
  f32_param,
  inverse_softplus,
  numpy_rng,
  real_BxL,
  zero_padded,
)
from models.mixers.gla import (
  chunk_scan,
  head_rms_norm,
  head_width,
  normal_linear,
  positive_option,
)

_F32 = jnp.float32
_HIGHEST = jax.lax.Precision.HIGHEST
# The authors' l2norm eps (fla/modules/l2norm.py).
L2_EPS = 1e-6
# Gated DeltaNet's A and dt initialisation (fla/layers/gated_deltanet.py).
A_INIT_RANGE = (0.0, 16.0)
DT_RANGE = (0.001, 0.1)
DT_FLOOR = 1e-4


def unit_lower_solve(a_XxCxC, rhs_XxCxF):
  """(I + A)^-1 rhs for a strictly lower triangular A, by matmuls only:
  -A is nilpotent ((-A)^C = 0), so (I + A)^-1 = sum_k (-A)^k =
  prod_j (I + (-A)^(2^j)) over 2^j < C, applied to rhs in ceil(log2 C)
  steps. Exact algebra (the same inverse as a triangular solve), and no
  LAPACK custom call: XLA's CPU backend runs it with the rest of the step
  (a triangular solve's custom call under a 4-device CPU mesh was seen to
  stall a test run on an oversubscribed 2-core machine)."""
  p_XxCxC = -a_XxCxC
  y_XxCxF = rhs_XxCxF
  span = 1
  while span < a_XxCxC.shape[-1]:
    y_XxCxF = y_XxCxF + _einsum('xij,xjf->xif', p_XxCxC, y_XxCxF)
    span *= 2
    if span < a_XxCxC.shape[-1]:
      p_XxCxC = _einsum('xij,xjk->xik', p_XxCxC, p_XxCxC)
  return y_XxCxF


def _einsum(spec, *operands):
  return jnp.einsum(spec, *operands, precision=_HIGHEST)


def l2_normalise(x_XxK):
  """x / sqrt(|x|^2 + eps) over the last axis (0 at 0), float32."""
  ss_Xx1 = jnp.sum(jnp.square(x_XxK), axis=-1, keepdims=True)
  return x_XxK * jax.lax.rsqrt(ss_Xx1 + L2_EPS)


def delta_chunk_step(s_XxKxV, xs):
  """One chunk of the (gated) delta rule: the entering state and (q, k
  [X, C, K], v [X, C, V], beta, log alpha [X, C]) float32 -> (the leaving
  state, o [X, C, V])."""
  q_XxCxK, k_XxCxK, v_XxCxV, beta_XxC, g_XxC = xs
  c, kd = k_XxCxK.shape[1:]
  b_XxC = jnp.cumsum(g_XxC, axis=1)
  tril_CxC = jnp.tril(jnp.ones((c, c), bool))
  below_CxC = jnp.tril(jnp.ones((c, c), bool), -1)
  diff_XxCxC = jnp.where(tril_CxC, b_XxC[:, :, None] - b_XxC[:, None, :], 0.0)
  gamma_XxCxC = jnp.where(tril_CxC, jnp.exp(diff_XxCxC), 0.0)
  kk_XxCxC = _einsum('xik,xjk->xij', k_XxCxK, k_XxCxK)
  a_XxCxC = jnp.where(
    below_CxC, beta_XxC[:, :, None] * gamma_XxCxC * kk_XxCxC, 0
  )
  decay_XxCx1 = jnp.exp(b_XxC)[..., None]
  rhs_XxCxF = beta_XxC[..., None] * jnp.concatenate(
    [decay_XxCx1 * k_XxCxK, v_XxCxV], axis=-1
  )
  wu_XxCxF = unit_lower_solve(a_XxCxC, rhs_XxCxF)
  w_XxCxK, u_XxCxV = wu_XxCxF[..., :kd], wu_XxCxF[..., kd:]
  u_XxCxV = u_XxCxV - _einsum('xck,xkv->xcv', w_XxCxK, s_XxKxV)
  qk_XxCxC = _einsum('xik,xjk->xij', q_XxCxK, k_XxCxK) * gamma_XxCxC
  o_XxCxV = _einsum('xck,xkv->xcv', decay_XxCx1 * q_XxCxK, s_XxKxV) + _einsum(
    'xij,xjv->xiv', qk_XxCxC, u_XxCxV
  )
  b_X = b_XxC[:, -1]
  kb_XxCxK = k_XxCxK * jnp.exp(b_X[:, None] - b_XxC)[..., None]
  s_XxKxV = jnp.exp(b_X)[:, None, None] * s_XxKxV + _einsum(
    'xck,xcv->xkv', kb_XxCxK, u_XxCxV
  )
  return s_XxKxV, o_XxCxV


def delta_chunked(q_XxLxK, k_XxLxK, v_XxLxV, beta_XxL, g_XxL, chunk):
  """o_t = q_t S_t with S_t = alpha_t S_(t-1) + k_t^T beta_t (v_t - k_t
  alpha_t S_(t-1)) ([K, V] states, S_-1 = 0, log alpha_t = g_t <= 0), for
  rows X, in chunks of min(chunk, L) positions. float32 [X, L, V]."""
  xs = tuple(
    t.astype(_F32) for t in (q_XxLxK, k_XxLxK, v_XxLxV, beta_XxL, g_XxL)
  )
  rows, _, kd = xs[0].shape
  s_XxKxV = jnp.zeros((rows, kd, xs[2].shape[-1]), _F32)
  return chunk_scan(delta_chunk_step, s_XxKxV, xs, chunk)


class DeltaDirection(nnx.Module):
  """The convs and gates of one direction."""

  def __init__(self, emb_dim, heads, widths, conv, gated, std, dtype, rngs):
    rng = numpy_rng(rngs)
    # The q, k and v convs' kernels [W, F] (None: no conv).
    self.q_conv, self.k_conv, self.v_conv = (
      f32_param(std * rng.standard_normal((conv, w))) if conv else None
      for w in widths
    )
    self.b_proj = normal_linear(emb_dim, heads, std, dtype, rngs)
    self.gated = gated
    if gated:
      self.a_proj = normal_linear(emb_dim, heads, std, dtype, rngs)
      self.a_log_H = f32_param(np.log(rng.uniform(*A_INIT_RANGE, (heads,))))
      log_dt_H = rng.uniform(*np.log(DT_RANGE), (heads,))
      dt_H = np.maximum(np.exp(log_dt_H), DT_FLOOR)
      self.dt_bias_H = f32_param(inverse_softplus(dt_H))

  def features(self, qkv, real_BxL):
    """(q, k, v) projections float32 [B, L, F], zero at padding ->
    SiLU(conv(.)), zero at padding."""
    out = []
    for conv, t_BxLxF in zip((self.q_conv, self.k_conv, self.v_conv), qkv):
      if conv is not None:
        w_WxF = conv[...]
        t_BxLxF = causal_conv(t_BxLxF, w_WxF, jnp.zeros(w_WxF.shape[1:]))
      out.append(jnp.where(real_BxL[..., None], jax.nn.silu(t_BxLxF), 0.0))
    return out

  def gates(self, x_BxLxE, real_BxL):
    """(beta, log alpha) float32 [B, L, H]: 0 at padded steps."""
    beta = jax.nn.sigmoid(self.b_proj(x_BxLxE).astype(_F32))
    beta = jnp.where(real_BxL[..., None], beta, 0.0)
    if not self.gated:
      return beta, jnp.zeros_like(beta)
    a_BxLxH = self.a_proj(x_BxLxE).astype(_F32) + self.dt_bias_H[...]
    g = -jnp.exp(self.a_log_H[...]) * jax.nn.softplus(a_BxLxH)
    return beta, jnp.where(real_BxL[..., None], g, 0.0)


@register('deltanet')
class DeltaNet(SequenceMixer):
  """DeltaNet / Gated DeltaNet (causal, or bidirectional by two passes)."""

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
    expand_k=1.0,
    expand_v=1.0,
    short_conv=4,
    chunk_size=64,
    gated=False,
    initializer_range=0.02,
  ):
    """Args (own options):
    expand_k: key width H K = int(expand_k * emb_dim).
    expand_v: value width H V = int(expand_v * emb_dim).
    short_conv: the width of the causal depthwise convs on q, k, v; 0: none.
    chunk_size: C, positions per chunk of the WY form.
    gated: Gated DeltaNet (a decay per head and an output gate).
    initializer_range: the std of every linear and conv kernel.
    """
    del max_length, dropout_rate, layer_index
    name = 'deltanet'
    h = int_option(name, 'num_heads', num_heads, 1, 8)
    self.key_width = head_width(name, 'expand_k', expand_k, emb_dim, h, 1)
    self.value_width = head_width(name, 'expand_v', expand_v, emb_dim, h, 1)
    self.conv_width = int_option(name, 'short_conv', short_conv, 0, 4)
    self.chunk_size = int_option(name, 'chunk_size', chunk_size, 1, 64)
    self.gated = bool_option(name, 'gated', gated)
    std = positive_option(name, 'initializer_range', initializer_range, 0.02)
    self.num_heads, self.dtype = h, dtype
    kd, vd = h * self.key_width, h * self.value_width
    linear = lambda i, o: normal_linear(i, o, std, dtype, rngs)  # noqa: E731
    self.q_proj = linear(emb_dim, kd)
    self.k_proj = linear(emb_dim, kd)
    self.v_proj = linear(emb_dim, vd)
    direction = lambda: DeltaDirection(  # noqa: E731
      emb_dim, h, (kd, kd, vd), self.conv_width, self.gated, std, dtype, rngs
    )
    self.fwd = direction()
    self.bwd = direction()
    self.g_proj = linear(emb_dim, vd) if self.gated else None
    self.norm_V = nnx.Param(jnp.ones((self.value_width,), _F32))
    self.o_proj = linear(vd, emb_dim)

  def state_size(self):
    """H K V numbers per example plus the convs' last W - 1 inputs of q, k
    and v (one direction, as for causal recurrent inference)."""
    h, kd, vd = self.num_heads, self.key_width, self.value_width
    conv = max(self.conv_width - 1, 0) * h * (2 * kd + vd)
    return h * kd * vd + conv

  def __call__(self, x_BxLxE, mask, *, rngs=None):
    del rngs
    b, length, _ = x_BxLxE.shape
    h, kd, vd = self.num_heads, self.key_width, self.value_width
    real = real_BxL(mask, b, length)
    xc_BxLxE = zero_padded(x_BxLxE, mask).astype(self.dtype)
    qkv = [
      jnp.where(real[..., None], p(xc_BxLxE).astype(_F32), 0.0)
      for p in (self.q_proj, self.k_proj, self.v_proj)
    ]
    flip = lambda t: t[:, ::-1]  # noqa: E731  along L
    directions = [(self.fwd, qkv, xc_BxLxE, real)]
    if not mask.causal:
      directions.append(
        (self.bwd, [flip(t) for t in qkv], flip(xc_BxLxE), flip(real))
      )

    def heads(t, width):  # [B, L, H W] -> [B, H, L, W]
      return jnp.swapaxes(t.reshape(b, length, h, width), 1, 2)

    per_direction = []
    for d, qkv_d, x_d, real_d in directions:
      q, k, v = d.features(qkv_d, real_d)
      q = l2_normalise(heads(q, kd)) * kd**-0.5
      k = l2_normalise(heads(k, kd))
      beta, g = (jnp.swapaxes(t, 1, 2) for t in d.gates(x_d, real_d))
      per_direction.append((q, k, heads(v, vd), beta, g))
    # Both directions in one scan: rows [G B H, ...].
    g_dirs = len(directions)
    stacked = (jnp.stack(t) for t in zip(*per_direction))
    rows = lambda t: t.reshape((-1,) + t.shape[3:])  # noqa: E731
    o_XxLxV = delta_chunked(*map(rows, stacked), self.chunk_size)
    o_GxBxHxLxV = o_XxLxV.reshape(g_dirs, b, h, length, vd)
    o_BxLxHxV = jnp.swapaxes(o_GxBxHxLxV[0], 1, 2)
    if not mask.causal:
      o_BxLxHxV = o_BxLxHxV + flip(jnp.swapaxes(o_GxBxHxLxV[1], 1, 2))
    o_BxLxHxV = head_rms_norm(o_BxLxHxV, self.norm_V[...])
    if self.g_proj is not None:
      r_BxLxF = self.g_proj(xc_BxLxE).astype(_F32)
      o_BxLxHxV = o_BxLxHxV * jax.nn.silu(r_BxLxF.reshape(b, length, h, vd))
    out_BxLxE = self.o_proj(
      o_BxLxHxV.reshape(b, length, h * vd).astype(self.dtype)
    )
    out_BxLxE = jnp.where(real[:, :, None], out_BxLxE, 0)
    return out_BxLxE.astype(x_BxLxE.dtype), {}
