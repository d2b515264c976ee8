"""Local (block) attention: each query attends within its own block.

No single paper; the LRA baseline "Local Attention" (Tay et al., "Long Range
Arena: A Benchmark for Efficient Transformers", arXiv 2011.04006), after the
block-local attention of Parmar et al., "Image Transformer" (arXiv 1802.05751).

  out_i = softmax_j(q_i k_j / sqrt(D) | floor(i / b) == floor(j / b)) v

The sequence is cut into non-overlapping contiguous blocks of b positions
(padded at the end to a multiple of b, the padding masked) and each block runs
exact softmax attention on itself; causal masks add j <= i. Time O(L b D),
memory O(L b) per head. Attention dropout applies to the block weights.

Exact limit: block_size >= L (one block) equals plain softmax attention.

Differences from the reference harness (google-research/long-range-arena):
its reshape of [B, L, ...] into blocks took positions with a stride of L / b
(strided "blocks"); here blocks are contiguous, as the method intends. Queries
and keys must have the same length (self-attention).
"""

import jax.numpy as jnp
import numpy as np

from models.attention.base import (
  AttentionCore,
  int_option,
  key_valid_BxM,
  masked_softmax,
  pad_to_multiple,
)
from models.attention.registry import register


def to_blocks(x_BxLxHxD, size):
  """[B, L, H, D] -> [B, N, C, H, D], L padded with zeros to N * C, C = size."""
  x_BxLxHxD = pad_to_multiple(x_BxLxHxD, size, axis=1)
  b, length, h, d = x_BxLxHxD.shape
  return x_BxLxHxD.reshape(b, length // size, size, h, d)


def from_blocks(x_BxNxCxHxD, length):
  """[B, N, C, H, D] -> [B, L, H, D], dropping the padding beyond `length`."""
  b, n, c, h, d = x_BxNxCxHxD.shape
  return x_BxNxCxHxD.reshape(b, n * c, h, d)[:, :length]


def valid_blocks(mask, batch, length, size):
  """bool[B, N, C]: real keys in blocks of `size`, the padded tail False."""
  valid_BxM = pad_to_multiple(
    key_valid_BxM(mask, batch, length), size, axis=1, value=False
  )
  return valid_BxM.reshape(batch, -1, size)


def attend_flat(
  q_XxCxD, k_XxKxD, v_XxKxD, allowed_XxCxK, *, scale, rate=0.0, key=None
):
  """`base.attend` for q, k, v with the same leading dims X, run over one
  merged batch dim prod(X). On XLA's CPU backend the backward pass (its key
  and value gradients contract over the query rows, outside the fast
  matmul path) is faster so than with the dims B, N, H kept apart (issue
  #35). Values, gradients and dropout masks (the same random
  bits: one draw over prod(X) * C * K elements in the same order) equal
  `attend`'s."""
  lead = q_XxCxD.shape[:-2]
  x, c, k = int(np.prod(lead)), q_XxCxD.shape[-2], k_XxKxD.shape[-2]
  allowed_XxCxK = jnp.broadcast_to(
    allowed_XxCxK, lead + allowed_XxCxK.shape[-2:]
  )
  logits_XxCxK = jnp.einsum(
    'xcd,xkd->xck',
    q_XxCxD.reshape(x, c, -1),
    k_XxKxD.reshape(x, k, -1),
    preferred_element_type=jnp.float32,
  )
  weights_XxCxK = masked_softmax(
    logits_XxCxK * scale,
    allowed_XxCxK.reshape((x,) + allowed_XxCxK.shape[-2:]),
    rate,
    key,
  )
  out_XxCxD = jnp.einsum(
    'xck,xkd->xcd',
    weights_XxCxK.astype(v_XxKxD.dtype),
    v_XxKxD.reshape(x, k, -1),
  )
  return out_XxCxD.reshape(lead + (c, -1))


def check_self_attention(core, length_q, length_k):
  if length_q != length_k:
    raise ValueError(
      f'Attention core {core.registry_name!r} needs queries and keys of the '
      f'same length, got {length_q} and {length_k}.'
    )


@register('local')
class LocalAttention(AttentionCore):
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
    block_size=50,
  ):
    del num_heads, max_length, rngs, layer_index
    int_option('local', 'block_size', block_size, 1, 50)
    self.block_size = block_size
    self.dropout_rate = dropout_rate
    self.scale = head_dim**-0.5
    self.dtype = dtype

  def __call__(
    self, q_BxLxHxD, k_BxMxHxD, v_BxMxHxD, mask, *, rngs=None, memory=None
  ):
    del memory
    b, length, _, _ = q_BxLxHxD.shape
    check_self_attention(self, length, k_BxMxHxD.shape[1])
    size = min(self.block_size, length)
    # [B, N, C, H, D] -> [B, N, H, C, D]: attend over the last two axes.
    q_BxNxHxCxD, k_BxNxHxCxD, v_BxNxHxCxD = (
      to_blocks(t, size).transpose(0, 1, 3, 2, 4)
      for t in (q_BxLxHxD, k_BxMxHxD, v_BxMxHxD)
    )
    valid_BxNxC = valid_blocks(mask, b, length, size)
    allowed_BxNx1xCxC = valid_BxNxC[:, :, None, None, :]
    if mask.causal:
      allowed_BxNx1xCxC = allowed_BxNx1xCxC & jnp.tril(
        jnp.ones((size, size), bool)
      )
    out_BxNxHxCxD = attend_flat(
      q_BxNxHxCxD,
      k_BxNxHxCxD,
      v_BxNxHxCxD,
      allowed_BxNx1xCxC,
      scale=self.scale,
      rate=self.dropout_rate,
      key=rngs,
    )
    out_BxLxHxD = from_blocks(out_BxNxHxCxD.transpose(0, 1, 3, 2, 4), length)
    return out_BxLxHxD.astype(self.dtype), {}
