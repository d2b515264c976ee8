"""Positions applied inside attention: position-infused and rotary.

`model.positions` names one scheme for the whole model (the list is in
models/embeddings.py). The two below are applied in one place,
MultiHeadAttention (models/layers.py), after the core is built; the cores
themselves never compute a position (a recurrent core under 'pia' is
handed its window's key positions to add, below).

'pia': Press, Smith and Lewis, "Shortformer: Better Language Modeling using
Shorter Inputs" (arXiv 2012.15832), position-infused attention:
  q_i = W_q (x_i + p_i),  k_j = W_k (x_j + p_j),  v_j = W_v x_j
with p the sinusoidal encoding of Vaswani et al. (`sinusoidal_LxE`, width
E), added to the inputs of the query and key projections of every layer and
never to the values or the residual stream, so no layer's output carries an
absolute position. Without a memory, positions are 0 .. L - 1 of the
tokens passed to the call (the CLS, when prepended, is position 0).

Under segment recurrence (models/recurrent.py: a recurrent core called with
`memory=`), the positions are those of Shortformer's cached window
[memory; segment] (Shortformer caches the previous subsequence's layer
inputs, which PIA keeps free of positions, and adds the window's positions
to the queries and keys of [cache; current]): with M memory slots before
the segment (the core's `context_length`; for the compressive core its
compressed slots, then its memories), the memory's keys are at 0 .. M-1
and the segment's queries and keys at M .. M+L-1. So a memory key and a
current key of the same content and the same offset in their segments
differ. Every segment has these positions, the first too (its memory is
empty, all slots masked; Shortformer's first window, without a cache,
starts at 0): one program for all segments. Our memory caches projected
keys, not layer inputs; since W_k is linear (no bias), W_k (x_j + p_j) =
W_k x_j + W_k p_j, so MultiHeadAttention passes the core position-free keys
W_k x (what it caches, and what the compressive core compresses) plus
`key_positions_KxHxD` = W_k p_j for the K = M + L window positions, which
the core adds to the keys it attends to (`pia_window`): the scores of
projecting [cache; current] + positions, for one more [K, E] x [E, H*D]
projection per call.

'rotary': Su et al., "RoFormer: Enhanced Transformer with Rotary Position
Embedding" (arXiv 2104.09864), eq. (34): features are taken in pairs
(2i, 2i + 1) (interleaved, as the paper; not the halves of some later
code), and the pair i of a vector at position m is rotated by the angle
m * theta_i, theta_i = 10000^(-2i / D), i = 0 .. D/2 - 1:
  (x_2i, x_2i+1) -> (x_2i cos m theta_i - x_2i+1 sin m theta_i,
                     x_2i sin m theta_i + x_2i+1 cos m theta_i)
i.e. x -> R_m x with R_m orthogonal and R_m^T R_n = R_(n - m), so
  (R_m q)^T (R_n k) = q^T R_(n - m) k
depends on the positions only through the offset n - m (eq. 16). Applied to
q and k after the projection and head split, before the core; values are
never rotated. Angles, cos and sin are float32 whatever the compute dtype
(m * theta_i is rounded to float32: at position 16K an angle is off by up to
about 1e-3 rad, as in the reference implementations); the rotated vectors
are cast back to the input dtype. The head dimension D must be even.

Which cores accept rotary is the core's `rotary` flag
(models/attention/base.py), checked at construction by `check_rotary`:
  'scores'   every logit is a dot product q_i . k_j of rotated vectors
             (softmax, local, sparse patterns, sinkhorn, reformer, ...):
             exact rotary attention on the core's pattern;
  'features' q and k are rotated before a random feature map whose kernel
             is a function of q . k and the norms only (performer): the
             kernel of rotated vectors, hence its expectation, depends on
             the offset only; at a finite number of features, approximately;
  None       refused with one sentence (the core's `rotary_refusal`).
"""

import jax.numpy as jnp

from models.embeddings import sinusoidal_LxE
from models.errors import UserError

# theta_i = BASE^(-2i / D): the paper's (and Vaswani et al.'s) base.
ROTARY_BASE = 10000.0


def pia_inputs(x_BxLxE, offset=0):
  """x + the sinusoidal positions offset .. offset + L - 1: the input of the
  query and key projections under position-infused attention."""
  length, width = x_BxLxE.shape[1], x_BxLxE.shape[2]
  # A trace-time constant (as the embedding's): derivable, not saved.
  pos_LxE = jnp.asarray(sinusoidal_LxE(length, width, offset))
  return x_BxLxE + pos_LxE.astype(x_BxLxE.dtype)


def pia_window(attention, x_BxLxE, memory):
  """(query input x + p_(M .. M+L-1), the core's key_positions [M + L, H,
  D] = W_k p_j for j = 0 .. M+L-1): pia over the window [memory; segment]
  of a recurrent core's call; `attention` the MultiHeadAttention, M the
  core's memory slots before the segment."""
  if attention.key is None:  # no recurrent core shares q and k
    raise ValueError('pia over a memory needs separate q and k projections')
  m = attention.core.context_length(memory)
  length, width = x_BxLxE.shape[1], x_BxLxE.shape[2]
  # A trace-time constant (as the embedding's): derivable, not saved.
  pos_KxE = jnp.asarray(sinusoidal_LxE(m + length, width)).astype(x_BxLxE.dtype)
  k_pos_KxHxD = attention.key(pos_KxE).reshape(
    m + length, attention.num_heads, attention.head_dim
  )
  return x_BxLxE + pos_KxE[m:], k_pos_KxHxD


def pia_qk_inputs(attention, x_BxLxE, memory):
  """(query input, key input, extra core arguments) of MultiHeadAttention
  `attention` under its positions: x, x, {} unless 'pia'; under 'pia'
  without memory x + p_(0 .. L-1) for both; with memory (a recurrent core)
  the window's (`pia_window`): the keys position-free, their positions
  passed to the core as key_positions_KxHxD."""
  if attention.positions != 'pia':
    return x_BxLxE, x_BxLxE, {}
  if memory is None:
    qk_BxLxE = pia_inputs(x_BxLxE)
    return qk_BxLxE, qk_BxLxE, {}
  q_BxLxE, k_pos_KxHxD = pia_window(attention, x_BxLxE, memory)
  return q_BxLxE, x_BxLxE, {'key_positions_KxHxD': k_pos_KxHxD}


def rotary_angles_LxP(length, head_dim, offset=0):
  """float32 [L, D/2]: m * theta_i for positions m = offset .. offset+L-1."""
  pairs = jnp.arange(head_dim // 2, dtype=jnp.float32)
  theta_P = ROTARY_BASE ** (-2.0 * pairs / head_dim)
  pos_L = offset + jnp.arange(length, dtype=jnp.float32)
  return pos_L[:, None] * theta_P[None, :]


def rotate(x_BxLxHxD, offset=0):
  """R_m x for every position m = offset .. offset + L - 1 (axis 1), pairs
  (2i, 2i + 1); float32 arithmetic, result in x's dtype."""
  _, length, _, d = x_BxLxHxD.shape
  if d % 2:
    raise ValueError(f'rotary positions need an even head dim, got {d}')
  angle_Lx1xP = rotary_angles_LxP(length, d, offset)[:, None, :]
  cos, sin = jnp.cos(angle_Lx1xP), jnp.sin(angle_Lx1xP)
  x32 = x_BxLxHxD.astype(jnp.float32)
  even_BxLxHxP, odd_BxLxHxP = x32[..., 0::2], x32[..., 1::2]
  out_BxLxHxPx2 = jnp.stack(
    [even_BxLxHxP * cos - odd_BxLxHxP * sin,
     even_BxLxHxP * sin + odd_BxLxHxP * cos],
    axis=-1,
  )  # fmt: skip
  return out_BxLxHxPx2.reshape(x_BxLxHxD.shape).astype(x_BxLxHxD.dtype)


def check_rotary(core, head_dim):
  """Raises the one-sentence UserError when rotary positions cannot apply
  to `core` (an AttentionCore instance) at this head dimension."""
  name = core.registry_name
  if core.rotary not in ('scores', 'features'):
    raise UserError(
      f'Attention core {name!r} cannot use rotary positions: '
      f'{core.rotary_refusal}; set --config.model.positions to pia or an '
      'absolute scheme (sinusoidal, learned).'
    )
  if head_dim % 2:
    raise UserError(
      f'Rotary positions rotate pairs of features and need an even head '
      f'dimension, got qkv_dim / num_heads = {head_dim}; change '
      '--config.model.qkv_dim or --config.model.num_heads.'
    )
