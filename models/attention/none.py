"""No attention: the speed and memory ceiling for any attention core.

Not a mechanism from a paper and not a model for LRA tables: a core that
does no token mixing at all,
  out_i = v_i, or 0 for a query with no visible key (the contract's rule)
so that a model built with it costs only its projections, feed-forward
layers and embeddings. Measured side by side with the others
(`benchmark.py --ceiling`), it is the best speed and memory any attention
could reach at that width and depth: an efficient core's steps/s and memory
as a fraction of this row say how much of the budget its attention spends.

Time O(L D), memory O(L D) (a select); no parameters, no dropout (it has no
attention weights). q and k are unused, so XLA drops their projections too:
the ceiling omits them (a strict bar). It is trivially causal (query i
reads only position i). It is no limit of softmax attention: out_i = v_i
even at a padded position i (the contract speaks only of real queries,
whose v_i is real), so padded keys and values change no real output.
"""

import jax.numpy as jnp

from models.attention.base import AttentionCore, visible_any_BxL
from models.attention.registry import register
from models.errors import UserError


@register('none')
class NoAttention(AttentionCore):
  supports_causal = True
  rotary = None
  rotary_refusal = 'it forms no q.k scores (out = v)'

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
  ):
    del num_heads, head_dim, max_length, dropout_rate, rngs, layer_index
    self.dtype = dtype

  def __call__(
    self, q_BxLxHxD, k_BxMxHxD, v_BxMxHxD, mask, *, rngs=None, memory=None
  ):
    del k_BxMxHxD, rngs, memory
    b, length, _, _ = q_BxLxHxD.shape
    if v_BxMxHxD.shape[1] != length:
      raise UserError(
        f'Attention core none needs as many keys as queries (out = v), got '
        f'{v_BxMxHxD.shape[1]} and {length}; use it for self-attention only.'
      )
    out_BxLxHxD = v_BxMxHxD
    if mask.key_padding_BxM is not None:
      visible_BxL = visible_any_BxL(mask, b, length, length)
      out_BxLxHxD = jnp.where(visible_BxL[:, :, None, None], out_BxLxHxD, 0)
    return out_BxLxHxD.astype(self.dtype), {}
