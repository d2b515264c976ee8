"""Transformer-XL: segment recurrence with a memory of the previous segment.

Dai et al., "Transformer-XL: Attentive Language Models Beyond a
Fixed-Length Context" (arXiv 1901.02860). The input is cut into segments of
s tokens (models/recurrent.py runs them in order); each layer's attention
sees [stop_gradient(memory); current segment]:

  k~, v~ = [SG(k_mem); k], [SG(v_mem); v]    (memory: the m latest keys)
  out_i  = softmax_j(A_ij / sqrt(D) | key j visible) v~_j

with A the relative logits of models/attention/relative.py (terms a + b +
c + d, learned u, v and W_R; with `relative` off, A = q.k). After the call
the layer's memory becomes the last m of [memory; current]: the memory spans
m / s segments back, and a token sees about m tokens per layer further back,
N * m with N layers. Time O(s (m + s) D) per segment and head, memory
O(s (m + s)) per segment: linear in the input length at fixed s and m.

Options: `memory_length` m (0, the default: the segment length s), `causal`
(each query also sees no later key of its own segment; the memory is always
visible). Exact limit: with memory None (one segment) and zero W_R and u it
is plain softmax attention (tested in tests/test_attention_suite.py); two
segments with memory equal one pass over both with a banded mask
(tests/test_recurrent.py).

The memory is `memory=` in, aux['memory'] out (both None / absent for a
call without memory): {'k_BxMxHxD', 'v_BxMxHxD', 'valid_BxM'}, from
`initial_memory` (empty) for an input's first segment. Below, K = M + L is
the number of attended keys (memory, then the segment). It is
recomputed for every example (the first segment of an input starts from an
empty memory), never carried from one batch to the next, so a training run
resumed from a checkpoint is exactly the uninterrupted run.

Differences from the paper: the memory holds the layer's keys and values
rather than its input hidden states (the core only sees projected heads).
The forward pass is the same function, since the memory is rebuilt with the
current weights for every example; the backward pass differs in that W_k
and W_v get no gradient through the memory (the paper's stop-gradient is on
the hidden states, so they do). Under 'rotary' positions
MultiHeadAttention rotates q and k at their positions in the whole input, so
cached keys keep their true positions. Under 'pia' the positions are those
of Shortformer's cached window (models/positions.py, pia_window): the core
is passed position-free keys, which it caches, and `key_positions_KxHxD`,
W_k p_j for every attended position j = 0 .. K-1 (memory slots 0 .. M-1,
the segment M .. K-1), added to the keys it attends to, never to the
memory; the queries come at M .. K-1. A memory key and a current key of the
same content and in-segment offset then get different scores.
"""

import jax
import jax.numpy as jnp

from models.attention.base import (
  AttentionCore,
  bool_option,
  dropout,
  int_option,
  key_valid_BxM,
  masked_softmax,
)
from models.attention.registry import register
from models.attention.relative import RelativePositions


def memory_attention(q_BxLxHxD, k_BxKxHxD, valid_BxK, *, causal, rel, scale):
  """(logits, allowed): masked logits over keys whose last L are the
  queries' own segment; `rel` a RelativePositions or None (q.k only)."""
  length_q, length_k = q_BxLxHxD.shape[1], k_BxKxHxD.shape[1]
  if rel is not None:
    logits_BxHxLxK = rel.logits(q_BxLxHxD, k_BxKxHxD)
  else:
    logits_BxHxLxK = jnp.einsum(
      'blhd,bkhd->bhlk',
      q_BxLxHxD,
      k_BxKxHxD,
      preferred_element_type=jnp.float32,
    )
  allowed_Bx1xLxK = valid_BxK[:, None, None, :]
  if causal:  # query i sits at key position K - L + i
    pos_q = length_k - length_q + jnp.arange(length_q)
    allowed_Bx1xLxK = allowed_Bx1xLxK & (
      jnp.arange(length_k)[None, :] <= pos_q[:, None]
    )
  return logits_BxHxLxK * scale, allowed_Bx1xLxK


def content_attention(q_BxLxHxD, k_BxKxHxD, v_BxKxHxD, valid_BxK, scale):
  """softmax(q.k / sqrt(D)) v over the valid keys (zeros where none is)."""
  logits_BxHxLxK, allowed = memory_attention(
    q_BxLxHxD, k_BxKxHxD, valid_BxK, causal=False, rel=None, scale=scale
  )
  weights_BxHxLxK = masked_softmax(logits_BxHxLxK, allowed)
  return jnp.einsum('bhlk,bkhd->blhd', weights_BxHxLxK, v_BxKxHxD)


@register('transformer_xl')
class TransformerXLAttention(AttentionCore):
  supports_causal = True
  recurrent = True
  # Rotary (MultiHeadAttention) rotates q and k at their positions in the
  # whole input: cached keys keep the rotation of their true position.
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
    memory_length=0,
    causal=False,
    relative=False,
  ):
    del max_length, layer_index
    name = self.registry_name
    self.memory_length = int_option(
      name, 'memory_length', memory_length, 0, 512
    )
    self.causal = bool_option(name, 'causal', causal)
    self.rel = (
      RelativePositions(num_heads, head_dim, rngs=rngs) if relative else None
    )
    self.num_heads, self.head_dim = num_heads, head_dim
    self.dropout_rate = dropout_rate
    self.scale = head_dim**-0.5
    self.dtype = dtype

  def memory_size(self, segment_length):
    """m: the option, or the segment length s when it is 0 (unset)."""
    return self.memory_length or segment_length

  def initial_memory(self, batch, segment_length, dtype):
    """The empty memory an input starts from (no valid slot)."""
    m = self.memory_size(segment_length)
    shape = (batch, m, self.num_heads, self.head_dim)
    return {
      'k_BxMxHxD': jnp.zeros(shape, dtype),
      'v_BxMxHxD': jnp.zeros(shape, dtype),
      'valid_BxM': jnp.zeros((batch, m), bool),
    }

  def context_length(self, memory):
    """M: the number of memory slots attended before the segment (all of
    `context`'s; 0 without memory)."""
    return sum(x.shape[1] for x in self.context(memory)[2])

  def __call__(
    self,
    q_BxLxHxD,
    k_BxLxHxD,
    v_BxLxHxD,
    mask,
    *,
    rngs=None,
    memory=None,
    key_positions_KxHxD=None,
  ):
    """key_positions_KxHxD: added to the K = M + L attended keys only (pia's
    window, models/positions.py); the memory keeps the keys as passed."""
    valid_BxL = key_valid_BxM(mask, q_BxLxHxD.shape[0], k_BxLxHxD.shape[1])
    keys, values, valid = self.context(memory)
    keys.append(k_BxLxHxD)
    values.append(v_BxLxHxD)
    valid.append(valid_BxL)
    k_BxKxHxD = jnp.concatenate(keys, axis=1)
    if key_positions_KxHxD is not None:
      k_BxKxHxD = k_BxKxHxD + key_positions_KxHxD[None].astype(k_BxKxHxD.dtype)
    v_BxKxHxD = jnp.concatenate(values, axis=1)
    valid_BxK = jnp.concatenate(valid, axis=1)
    logits_BxHxLxK, allowed = memory_attention(
      q_BxLxHxD,
      k_BxKxHxD,
      valid_BxK,
      causal=mask.causal or self.causal,
      rel=self.rel,
      scale=self.scale,
    )
    weights_BxHxLxK = masked_softmax(logits_BxHxLxK, allowed)
    dropped = dropout(weights_BxHxLxK, self.dropout_rate, rngs)
    out_BxLxHxD = jnp.einsum(
      'bhlk,bkhd->blhd', dropped.astype(v_BxKxHxD.dtype), v_BxKxHxD
    )
    aux = {}
    if memory is not None:
      aux = self.update(
        memory, q_BxLxHxD, k_BxLxHxD, v_BxLxHxD, valid_BxL, weights_BxHxLxK
      )
    return out_BxLxHxD.astype(self.dtype), aux

  def context(self, memory):
    """Lists of stop-gradient keys, values and validity to put before the
    current segment's (empty without memory)."""
    if memory is None:
      return [], [], []
    sg = jax.lax.stop_gradient
    return (
      [sg(memory['k_BxMxHxD'])],
      [sg(memory['v_BxMxHxD'])],
      [memory['valid_BxM']],
    )

  def update(self, memory, q, k_BxLxHxD, v_BxLxHxD, valid_BxL, weights):
    """aux with the next memory: the last m of [memory; current]."""
    del q, weights
    return {'memory': shift_memory(memory, k_BxLxHxD, v_BxLxHxD, valid_BxL)[0]}


def shift_memory(memory, k_BxLxHxD, v_BxLxHxD, valid_BxL):
  """(next memory, evicted): the last m of [memory; current] and the first
  L, which fall out of the window (each a (k, v, valid) triple)."""
  m = memory['valid_BxM'].shape[1]
  parts = {
    'k_BxMxHxD': k_BxLxHxD,
    'v_BxMxHxD': v_BxLxHxD,
    'valid_BxM': valid_BxL,
  }
  kept, evicted = {}, []
  for name, new in parts.items():
    both = jnp.concatenate([memory[name], new.astype(memory[name].dtype)], 1)
    both = jax.lax.stop_gradient(both)
    cut = both.shape[1] - m
    kept[name] = both[:, cut:]
    evicted.append(both[:, :cut])
  return kept, tuple(evicted)
