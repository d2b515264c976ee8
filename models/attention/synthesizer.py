"""Synthesizer: attention weights synthesized without (only) token-token dots.

Tay et al., "Synthesizer: Rethinking Self-Attention in Transformer Models"
(arXiv 2005.00743).
  out = softmax(S + [q k^T / sqrt(D)] | mask) v
where the synthetic logits S [H, L, M] come from one of three modes:
  random:            a learned table R [H, max_length, max_length], sliced to
                     L x M; input independent.
  factorized_random: R1 [H, max_length, k] @ R2 [H, max_length, k]^T, sliced.
  dense:             per query position i, a two-layer MLP of the query head
                     vector, relu(q_i W1 + b1) W2 + b2 (D -> D -> max_length,
                     per head), sliced to the M key positions.
The bracketed q.k term is added only with `mix_dot_product` (the paper's
mixtures; the reference's LRA runs used synthetic logits alone).
Time O(L M D) per head (O(L M) for random), memory O(L M): the method is
quadratic by design; its parameters are O(H max_length^2) in random mode.

Options (`model.attention.<option>`):
  mode: random (default, as the reference's LRA runs), factorized_random or
    dense.
  rank: k of factorized_random (default 8).
  mix_dot_product: add the scaled q.k logits (default false).

Initialisation, LeCun normal per head as in the reference: the random table
with fan-in max_length, R1 with fan-in max_length and R2 with fan-in k, so
random and factorized logits start with standard deviation about
max_length^-1/2 (near-uniform attention); the dense MLP's weights likewise,
with zero biases.

Padding: padded keys get no weight in every mode (masked before the
softmax); a query with no visible key returns zeros. Causal: supported in
every mode by masking j > i, since row i of S depends on nothing after i
(dense: only on q_i; random: on no input at all).

Exact limit: with mix_dot_product = true and all synthetic parameters zero
(S = 0) it equals softmax attention, causal or not, with padding.

Differences from the paper and the reference harness:
  - The core receives projected heads, so the dense MLP reads the query head
    vector q_i (the paper reads the layer input x_i); with
    mix_dot_product = false, k is unused and q is unused outside dense mode
    (their projections are wasted work; the reference replaced k by v).
  - The dense MLP has per-head weights (the reference shared its second
    layer across heads).
  - Padding is honoured in every mode, and an input longer than max_length is
    refused with a clear error.
  - random and factorized_random without mix_dot_product (the LRA
    setting): the logits do not depend on the example, so the softmax's
    exponentials are computed once per batch, with each example's padding
    applied in the numerator and the normaliser: memory O(H L M + B L H D)
    instead of O(B H L M), and no q.k work at all (the reference got its
    0.74x memory this way by ignoring padding). The row maximum is taken
    over all keys, so a row whose visible keys all lie more than about 87
    below its best logit (float32 exp underflow) would return zeros; the
    learned logits are nowhere near that. Attention dropout there uses one
    mask for the whole batch (the weights themselves are shared).
Attention dropout acts on the weights, as in softmax attention.
"""

from flax import nnx
import jax
import jax.numpy as jnp

from models.attention.base import (
  AttentionCore,
  dropout,
  key_valid_BxM,
  masked_softmax,
)
from models.attention.registry import register
from models.attention.softmax import dense_allowed
from models.errors import UserError

MODES = ('random', 'factorized_random', 'dense')


@register('synthesizer')
class SynthesizerAttention(AttentionCore):
  supports_causal = True
  needs_max_len = True
  # Only the q.k term of mix_dot_product can be rotary (None otherwise,
  # set in __init__); dense mode's MLP then reads the rotated q_i.
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
    mode='random',
    rank=8,
    mix_dot_product=False,
  ):
    del layer_index
    if mode not in MODES:
      raise UserError(
        f'Unknown synthesizer mode {mode!r}; set '
        f'--config.model.attention.mode to one of {", ".join(MODES)}.'
      )
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
      raise UserError(
        f'Synthesizer rank must be a positive integer, got {rank!r}; set '
        f'--config.model.attention.rank=8.'
      )
    if not isinstance(mix_dot_product, bool):
      raise UserError(
        f'Synthesizer mix_dot_product must be true or false, got '
        f'{mix_dot_product!r}; set '
        f'--config.model.attention.mix_dot_product=False or True.'
      )
    self.mode = mode
    self.mix_dot_product = mix_dot_product
    if not mix_dot_product:
      self.rotary = None
      self.rotary_refusal = (
        f'its {mode} logits form no q.k scores without mix_dot_product'
      )
    self.max_length = max_length
    self.dropout_rate = dropout_rate
    self.scale = head_dim**-0.5
    self.dtype = dtype
    h, n = num_heads, max_length
    f32 = jnp.float32
    # LeCun normal over the length (or rank) axis, per head.
    init = nnx.initializers.lecun_normal(batch_axis=(0,))
    if mode == 'random':
      self.table_HxNxN = nnx.Param(init(rngs.params(), (h, n, n), f32))
    elif mode == 'factorized_random':
      init_k = nnx.initializers.lecun_normal(
        in_axis=-1, out_axis=-2, batch_axis=(0,)
      )
      self.r1_HxNxK = nnx.Param(init(rngs.params(), (h, n, rank), f32))
      self.r2_HxNxK = nnx.Param(init_k(rngs.params(), (h, n, rank), f32))
    else:
      d = head_dim
      self.w1_HxDxD = nnx.Param(init(rngs.params(), (h, d, d), f32))
      self.b1_HxD = nnx.Param(jnp.zeros((h, d), f32))
      self.w2_HxDxN = nnx.Param(init(rngs.params(), (h, d, n), f32))
      self.b2_HxN = nnx.Param(jnp.zeros((h, n), f32))

  def __call__(
    self, q_BxLxHxD, k_BxMxHxD, v_BxMxHxD, mask, *, rngs=None, memory=None
  ):
    del memory
    length, m = q_BxLxHxD.shape[1], k_BxMxHxD.shape[1]
    if max(length, m) > self.max_length:
      raise UserError(
        f'Synthesizer got length {max(length, m)} but was built for '
        f'max_length {self.max_length}; raise --config.max_length.'
      )
    logits_BxHxLxM = self.synthetic_logits(q_BxLxHxD, m)
    if self.mode != 'dense' and not self.mix_dot_product:
      return self._shared_logits(logits_BxHxLxM[0], v_BxMxHxD, mask, rngs), {}
    if self.mix_dot_product:
      logits_BxHxLxM = logits_BxHxLxM + self.scale * jnp.einsum(
        'blhd,bmhd->bhlm',
        q_BxLxHxD,
        k_BxMxHxD,
        preferred_element_type=jnp.float32,
      )
    allowed = dense_allowed(mask, length, m)
    weights_BxHxLxM = masked_softmax(
      logits_BxHxLxM,
      True if allowed is None else allowed,
      self.dropout_rate,
      rngs,
    )
    out_BxLxHxD = jnp.einsum(
      'bhlm,bmhd->blhd', weights_BxHxLxM.astype(v_BxMxHxD.dtype), v_BxMxHxD
    )
    return out_BxLxHxD.astype(self.dtype), {}

  def _shared_logits(self, logits_HxLxM, v_BxMxHxD, mask, key):
    """Random modes alone: the logits are the same for every example, so
    the exponentials are computed once for the batch and an example's
    padding enters as a mask of its keys in the numerator and the
    normaliser. No [B, H, L, M] array: O(H L M + B L H D) memory."""
    b, m = v_BxMxHxD.shape[0], v_BxMxHxD.shape[1]
    if mask.causal:
      logits_HxLxM = jnp.where(
        jnp.tril(jnp.ones(logits_HxLxM.shape[1:], bool)), logits_HxLxM, -1e30
      )
    top_HxLx1 = jax.lax.stop_gradient(
      jnp.max(logits_HxLxM, axis=-1, keepdims=True)
    )
    exp_HxLxM = jnp.exp(logits_HxLxM - top_HxLx1)
    valid_BxM = key_valid_BxM(mask, b, m).astype(jnp.float32)
    norm_BxLxH = jnp.einsum('hlm,bm->blh', exp_HxLxM, valid_BxM)
    # Dropping normalised weights = dropping numerator terms (one mask for
    # the batch: the weights are shared).
    kept_HxLxM = dropout(exp_HxLxM, self.dropout_rate, key)
    num_BxLxHxD = jnp.einsum(
      'hlm,bmhd->blhd',
      kept_HxLxM.astype(v_BxMxHxD.dtype),
      v_BxMxHxD * valid_BxM[:, :, None, None].astype(v_BxMxHxD.dtype),
      preferred_element_type=jnp.float32,
    )
    safe_BxLxH = jnp.where(norm_BxLxH > 0, norm_BxLxH, 1.0)
    out_BxLxHxD = jnp.where(
      (norm_BxLxH > 0)[..., None], num_BxLxHxD / safe_BxLxH[..., None], 0.0
    )
    return out_BxLxHxD.astype(self.dtype)

  def synthetic_logits(self, q_BxLxHxD, m):
    """S, float32 [B|1, H, L, M], sliced from the max_length tables."""
    length = q_BxLxHxD.shape[1]
    if self.mode == 'random':
      return self.table_HxNxN[...][None, :, :length, :m]
    if self.mode == 'factorized_random':
      return jnp.einsum(
        'hlk,hmk->hlm',
        self.r1_HxNxK[...][:, :length],
        self.r2_HxNxK[...][:, :m],
      )[None]
    hidden_BxLxHxD = jax.nn.relu(
      jnp.einsum(
        'blhd,hde->blhe',
        q_BxLxHxD,
        self.w1_HxDxD[...].astype(q_BxLxHxD.dtype),
        preferred_element_type=jnp.float32,
      )
      + self.b1_HxD[...]
    )
    return (
      jnp.einsum('blhe,hem->bhlm', hidden_BxLxHxD, self.w2_HxDxN[...][:, :, :m])
      + self.b2_HxN[...][None, :, None, :m]
    )
