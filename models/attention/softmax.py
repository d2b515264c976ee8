"""Exact softmax attention: the oracle every efficient core is tested against.

Vaswani et al., "Attention Is All You Need" (arXiv 1706.03762).
  out = softmax(q k^T / sqrt(D) + mask) v
Time O(L M D), memory O(L M) per head for the einsum path; the fused path
(`jax.nn.dot_product_attention`) lets XLA pick a kernel (cuDNN flash attention
on GPU: O(L) memory). It is its own exact limit.

Two implementations of one function:
  'einsum': explicit logits, as LRA measured it; supports attention dropout.
  'fused':  jax.nn.dot_product_attention; no attention dropout.

`relative` (set by `model.positions='relative'`, einsum only): the logits
are Transformer-XL's relative ones, (q_i + u).k_j + (q_i + v).W_R R_(i-j)
(models/attention/relative.py); zero W_R and u give plain softmax back.
"""

import jax
import jax.numpy as jnp

from errors import UserError
from models.attention.base import AttentionCore, dropout, visible_any_BxL
from models.attention.registry import register
from models.attention.relative import RelativePositions

IMPLEMENTATIONS = ('einsum', 'fused')


@register('softmax')
class SoftmaxAttention(AttentionCore):
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
    implementation='einsum',
    relative=False,
  ):
    del max_length, layer_index
    if implementation not in IMPLEMENTATIONS:
      raise UserError(
        f'Unknown softmax implementation {implementation!r}; use one of '
        f'{", ".join(IMPLEMENTATIONS)}.'
      )
    if implementation == 'fused' and dropout_rate > 0:
      raise UserError(
        'The fused softmax path has no attention dropout; set '
        '--config.model.attention_dropout_rate=0.'
      )
    if relative and implementation == 'fused':
      raise UserError(
        'The fused softmax path has no relative positions; set '
        '--config.model.attention.implementation=einsum or another '
        '--config.model.positions.'
      )
    self.rel = (
      RelativePositions(num_heads, head_dim, rngs=rngs) if relative else None
    )
    self.implementation = implementation
    self.dropout_rate = dropout_rate
    self.scale = head_dim**-0.5
    self.dtype = dtype

  def __call__(
    self, q_BxLxHxD, k_BxMxHxD, v_BxMxHxD, mask, *, rngs=None, memory=None
  ):
    del memory
    b, length, _, _ = q_BxLxHxD.shape
    m = k_BxMxHxD.shape[1]
    visible_BxL = visible_any_BxL(mask, b, length, m)
    if self.implementation == 'fused':
      out_BxLxHxD = self._fused(q_BxLxHxD, k_BxMxHxD, v_BxMxHxD, mask)
    else:
      out_BxLxHxD = self._einsum(q_BxLxHxD, k_BxMxHxD, v_BxMxHxD, mask, rngs)
    out_BxLxHxD = jnp.where(visible_BxL[:, :, None, None], out_BxLxHxD, 0)
    return out_BxLxHxD.astype(self.dtype), {}

  def _einsum(self, q_BxLxHxD, k_BxMxHxD, v_BxMxHxD, mask, key):
    if self.rel is not None:
      logits_BxHxLxM = self.rel.logits(q_BxLxHxD, k_BxMxHxD) * self.scale
    else:
      logits_BxHxLxM = (
        jnp.einsum(
          'blhd,bmhd->bhlm',
          q_BxLxHxD,
          k_BxMxHxD,
          preferred_element_type=jnp.float32,
        )
        * self.scale
      )
    allowed = dense_allowed(mask, q_BxLxHxD.shape[1], k_BxMxHxD.shape[1])
    if allowed is not None:
      logits_BxHxLxM = jnp.where(allowed, logits_BxHxLxM, -1e30)
    weights_BxHxLxM = jax.nn.softmax(logits_BxHxLxM, axis=-1)
    weights_BxHxLxM = dropout(weights_BxHxLxM, self.dropout_rate, key)
    return jnp.einsum(
      'bhlm,bmhd->blhd', weights_BxHxLxM.astype(v_BxMxHxD.dtype), v_BxMxHxD
    )

  def _fused(self, q_BxLxHxD, k_BxMxHxD, v_BxMxHxD, mask):
    padding = None
    if mask.key_padding_BxM is not None:
      padding = mask.key_padding_BxM[:, None, None, :]
    return jax.nn.dot_product_attention(
      q_BxLxHxD,
      k_BxMxHxD,
      v_BxMxHxD,
      mask=padding,
      is_causal=mask.causal,
      scale=self.scale,
    )


def dense_allowed(mask, length_q, length_k):
  """bool[B|1, 1, L, M] of allowed (query, key) pairs, or None (all).

  Only for the exact core: efficient cores never build an L x M array.
  """
  allowed = None
  if mask.key_padding_BxM is not None:
    allowed = mask.key_padding_BxM[:, None, None, :]
  if mask.causal:
    causal = jnp.tril(jnp.ones((length_q, length_k), bool))[None, None]
    allowed = causal if allowed is None else allowed & causal
  return allowed
