"""Performer: FAVOR+ attention with positive orthogonal random features.

Choromanski et al., "Rethinking Attention with Performers"
(arXiv 2009.14794).
  exp(q . k / sqrt(D)) = E_w[phi(q) . phi(k)],  w ~ N(0, I_D)
  phi(x) = exp(w_f . x - |x|^2 / 2) / sqrt(m), f = 1..m, x scaled by D^-1/4
  out_i = phi(q_i) . sum_j phi(k_j) v_j^T / (phi(q_i) . sum_j phi(k_j))
over the visible keys j (causal: j <= i). Softmax attention's kernel is
replaced by an unbiased m-feature estimate of it, so the key-value summary
[m, D] is built once per head: time O(L m D), memory O(L m + m D) per head;
causal by prefix sums over chunks of 64 positions (kernel_attention.py). No
L x M array.

Options (`model.attention.<option>`):
  kernel: 'softmax' (default; FAVOR+ positive features above) or 'relu'
    (phi(x) = relu(w . x) / sqrt(m) + 1e-3 / sqrt(m), the paper's
    generalised attention; the reference harness defaulted to relu).
  num_features: m (default 256).
  orthogonal: true (default): block-orthogonal Gaussian rows (the Q of a
    QR factorisation of Gaussian D x D blocks, by Gram-Schmidt: Haar
    distributed), each row rescaled by the norm of an independent Gaussian
    D-vector (chi-distributed), as the paper; false: i.i.d. Gaussian rows.
  redraw: false (default): the features drawn at initialisation are used
    always; true: each call that gets a PRNG key (training: the trainer
    derives one per step and layer from fold_in(seed, step)) draws fresh
    features from it; calls without a key (evaluation) use the stored ones.

The features W [H, m, D] are drawn per head (independent draws for the heads
of a layer; the authors' code shares one draw over heads) from the
parameter key stream at construction, and live in `RandomFeatures`, a
non-trainable nnx.Variable (the optimiser only updates nnx.Param).

Numerical stability (float32 throughout): the softmax kernel's exponent is
reduced by a stabiliser that cancels in the ratio: for a query its max over
the m features, for keys the max over the features and the visible keys of
the example and head (padded keys excluded, so padding changes nothing), as
a stop_gradient constant (its exact gradient is zero). The largest feature
is then 1 / sqrt(m), never inf. Unlike the authors' code no 1e-4 is added to
the softmax features: exp is positive already, and with the global key
stabiliser an additive term would make causal outputs depend on later keys.
The relu kernel keeps the authors' additive 1e-3 (scaled by 1 / sqrt(m)
like the features) so its normaliser is positive. A query with no visible
key gets zeros.

Exact limit: none at finite m. The softmax kernel converges to exact softmax
attention as m -> infinity (an unbiased estimate of each exp(q . k /
sqrt(D)), error O(1 / sqrt(m)); tests: error falls 16 -> 1024 features).
For fixed features it equals the quadratic form phi(Q) phi(K)^T V /
(phi(Q) phi(K)^T 1) with the same visibility (tested).

Differences from the reference harness: softmax kernel by default (it used
relu), padded keys excluded (it summed over padding), per-head features.
No attention weights exist, so attention dropout (dropout_rate) is ignored.
"""

import functools

from flax import nnx
import jax
import jax.numpy as jnp

from models.attention.base import (
  AttentionCore,
  bool_option,
  int_option,
  key_valid_BxM,
)
from models.attention.kernel_attention import (
  kernel_attention_heads_first,
  swap_heads,
)
from models.attention.registry import register
from models.errors import UserError

KERNELS = ('softmax', 'relu')
# Additive term of relu features, in units of 1 / sqrt(m) (authors: 1e-3).
RELU_EPS = 1e-3


class RandomFeatures(nnx.Variable):
  """Performer's random projection W [H, m, D]: not trained."""


@functools.partial(jax.jit, static_argnums=(1, 2, 3, 4))
def draw_features(key, num_heads, num_features, head_dim, orthogonal):
  """W [H, m, D] float32: Gaussian rows, block-orthogonal if asked.

  Orthogonal: per head, ceil(m / D) Haar-orthogonal D x D blocks stacked and
  cut to m rows, each row rescaled by the norm of an independent Gaussian
  D-vector (chi-distributed). One Gaussian draw for all of it (threefry
  takes about a second to compile per shape on CPU).
  """
  h, m, d = num_heads, num_features, head_dim
  if not orthogonal:
    return jax.random.normal(key, (h, m, d), jnp.float32)
  n = -(-m // d)
  g_HxRxD = jax.random.normal(key, (h, n * d + m, d), jnp.float32)
  blocks_XxDxD = g_HxRxD[:, : n * d].reshape(h * n, d, d)
  rows_HxFxD = _orthonormal_rows(blocks_XxDxD).reshape(h, n * d, d)[:, :m]
  norms_HxF = jnp.linalg.norm(g_HxRxD[:, n * d :], axis=-1)
  return rows_HxFxD * norms_HxF[..., None]


def _orthonormal_rows(g_NxDxD):  # N: blocks
  """Gram-Schmidt (twice per row, for float32) on the rows of each block.

  Gives the Q of a QR factorisation with a positive diagonal of R (so
  Haar distributed for Gaussian input, with no sign fix-up), in plain array
  ops.
  """
  d = g_NxDxD.shape[-1]

  def body(i, q_NxDxD):
    row_NxD = g_NxDxD[:, i]
    for _ in range(2):  # rows >= i of q are still zero
      coef_NxD = jnp.einsum('nrd,nd->nr', q_NxDxD, row_NxD)
      row_NxD = row_NxD - jnp.einsum('nr,nrd->nd', coef_NxD, q_NxDxD)
    row_NxD = row_NxD / jnp.linalg.norm(row_NxD, axis=-1, keepdims=True)
    return q_NxDxD.at[:, i].set(row_NxD)

  return jax.lax.fori_loop(0, d, body, jnp.zeros_like(g_NxDxD))


def softmax_features(x_BxHxLxD, w_HxFxD, valid_BxL=None):
  """Positive random features of exp(q . k / sqrt(D)), float32, heads
  first: x [B, H, L, D] -> [B, H, L, m] (kernel_attention.py, Layout).

  Queries (valid_BxL None): stabiliser = max over features, per position.
  Keys (valid_BxL given): stabiliser = max over features and visible keys,
  per example and head; padded keys get 0.
  """
  d = x_BxHxLxD.shape[-1]
  m = w_HxFxD.shape[1]
  x_BxHxLxD = x_BxHxLxD.astype(jnp.float32) * d**-0.25
  proj_BxHxLxF = jnp.einsum('bhld,hfd->bhlf', x_BxHxLxD, w_HxFxD)
  half_sq_BxHxLx1 = 0.5 * jnp.sum(jnp.square(x_BxHxLxD), axis=-1, keepdims=True)
  e_BxHxLxF = proj_BxHxLxF - half_sq_BxHxLx1
  if valid_BxL is None:
    top = jnp.max(e_BxHxLxF, axis=-1, keepdims=True)
  else:
    e_BxHxLxF = jnp.where(valid_BxL[:, None, :, None], e_BxHxLxF, -jnp.inf)
    top = jnp.max(e_BxHxLxF, axis=(2, 3), keepdims=True)
    top = jnp.where(jnp.isfinite(top), top, 0.0)
  return jnp.exp(e_BxHxLxF - jax.lax.stop_gradient(top)) * m**-0.5


def relu_features(x_BxHxLxD, w_HxFxD):
  """relu(w . x) / sqrt(m) + eps, x scaled by D^-1/4, float32, heads
  first: [B, H, L, D] -> [B, H, L, m]."""
  d = x_BxHxLxD.shape[-1]
  m = w_HxFxD.shape[1]
  x_BxHxLxD = x_BxHxLxD.astype(jnp.float32) * d**-0.25
  proj_BxHxLxF = jnp.einsum('bhld,hfd->bhlf', x_BxHxLxD, w_HxFxD)
  return (jax.nn.relu(proj_BxHxLxF) + RELU_EPS) * m**-0.5


@register('performer')
class PerformerAttention(AttentionCore):
  supports_causal = True
  # Before the feature map: both kernels (exp and arc-cosine) are
  # functions of q . k and the norms, so rotary in expectation.
  rotary = 'features'

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
    kernel='softmax',
    num_features=256,
    orthogonal=True,
    redraw=False,
  ):
    del max_length, dropout_rate, layer_index
    if kernel not in KERNELS:
      raise UserError(
        f'Unknown performer kernel {kernel!r}; use one of {", ".join(KERNELS)}.'
      )
    int_option('performer', 'num_features', num_features, 1, 256)
    bool_option('performer', 'orthogonal', orthogonal)
    bool_option('performer', 'redraw', redraw)
    self.kernel = kernel
    self.num_features = num_features
    self.orthogonal = orthogonal
    self.redraw = redraw
    self.num_heads = num_heads
    self.head_dim = head_dim
    self.dtype = dtype
    self.features = RandomFeatures(
      draw_features(
        rngs.params(), num_heads, num_features, head_dim, orthogonal
      )
    )

  def feature_maps(self, q_BxLxHxD, k_BxMxHxD, valid_BxM, w_HxFxD=None):
    """(phi_q [B,L,H,m], phi_k [B,M,H,m]); stored features if w is None."""
    phi_q_BxHxLxF, phi_k_BxHxMxF = self._features(
      swap_heads(q_BxLxHxD), swap_heads(k_BxMxHxD), valid_BxM, w_HxFxD
    )
    return swap_heads(phi_q_BxHxLxF), swap_heads(phi_k_BxHxMxF)

  def _features(self, q_BxHxLxD, k_BxHxMxD, valid_BxM, w_HxFxD=None):
    """`feature_maps` heads first: (phi_q [B,H,L,m], phi_k [B,H,M,m])."""
    if w_HxFxD is None:
      w_HxFxD = self.features[...]
    if self.kernel == 'relu':
      return relu_features(q_BxHxLxD, w_HxFxD), relu_features(
        k_BxHxMxD, w_HxFxD
      )
    return softmax_features(q_BxHxLxD, w_HxFxD), softmax_features(
      k_BxHxMxD, w_HxFxD, valid_BxM
    )

  def __call__(
    self, q_BxLxHxD, k_BxMxHxD, v_BxMxHxD, mask, *, rngs=None, memory=None
  ):
    del memory
    b, m = k_BxMxHxD.shape[:2]
    valid_BxM = key_valid_BxM(mask, b, m)
    w_HxFxD = None
    if self.redraw and rngs is not None:
      w_HxFxD = draw_features(
        rngs, self.num_heads, self.num_features, self.head_dim, self.orthogonal
      )
    # Heads first throughout (kernel_attention.py, Layout).
    phi_q_BxHxLxF, phi_k_BxHxMxF = self._features(
      swap_heads(q_BxLxHxD), swap_heads(k_BxMxHxD), valid_BxM, w_HxFxD
    )
    out_BxHxLxD = kernel_attention_heads_first(
      phi_q_BxHxLxF,
      phi_k_BxHxMxF,
      swap_heads(v_BxMxHxD),
      valid_BxM,
      causal=mask.causal,
    )
    return swap_heads(out_BxHxLxD).astype(self.dtype), {}
