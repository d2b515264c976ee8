"""Linear Transformer: attention with the elu + 1 feature map.

Katharopoulos et al., "Transformers are RNNs: Fast Autoregressive
Transformers with Linear Attention" (arXiv 2006.16236).
  phi(x) = elu(x) + 1, applied to q and k as given (no 1/sqrt(D) scaling)
  out_i = phi(q_i) . sum_j phi(k_j) v_j^T / (phi(q_i) . sum_j phi(k_j))
over the visible keys j (causal: j <= i). The similarity exp(q.k / sqrt(D))
of softmax attention is replaced by phi(q) . phi(k), so the key-value
summary sum_j phi(k_j) v_j^T [D, D] is built once per head and every query
reads it: time O(L D^2), memory O(L D + D^2) per head; causal by prefix sums
over chunks of 64 positions (kernel_attention.py), memory O(L D^2 / 64 +
L 64). No L x M array.

Exact limit: none; it is a different attention (a kernel of degree one in
each of q and k), not an approximation of softmax. It equals the quadratic
form phi(Q) phi(K)^T V / (phi(Q) phi(K)^T 1) with the same visibility, which
the tests check.

Differences from the reference harness (google-research/long-range-arena):
padded keys are excluded (their features are zeroed), where the reference
summed over padded positions too. A query with no visible key gets zeros.
Sums and the normaliser are float32 in any compute dtype. There are no
attention weights, so attention dropout (dropout_rate) does not apply and is
ignored. No options: a pure function of (q, k, v, mask).
"""

import jax
import jax.numpy as jnp

from models.attention.base import AttentionCore, key_valid_BxM
from models.attention.kernel_attention import (
  kernel_attention_heads_first,
  swap_heads,
)
from models.attention.registry import register


def elu_features(x):
  """phi(x) = elu(x) + 1 in float32 (positive, so the normaliser is > 0),
  elementwise (any layout)."""
  return jax.nn.elu(x.astype(jnp.float32)) + 1.0


@register('linear_transformer')
class LinearTransformerAttention(AttentionCore):
  supports_causal = True
  rotary = None
  rotary_refusal = (
    'its elu + 1 feature map acts per coordinate, so rotated q and k '
    'give no offset-only scores (RoFormer eq. 19, rotation after the '
    'map, is not implemented)'
  )

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
    del rngs, memory
    b, m = k_BxMxHxD.shape[:2]
    # Heads first (kernel_attention.py, Layout); phi acts elementwise.
    out_BxHxLxD = kernel_attention_heads_first(
      elu_features(swap_heads(q_BxLxHxD)),
      elu_features(swap_heads(k_BxMxHxD)),
      swap_heads(v_BxMxHxD),
      key_valid_BxM(mask, b, m),
      causal=mask.causal,
    )
    return swap_heads(out_BxHxLxD).astype(self.dtype), {}
