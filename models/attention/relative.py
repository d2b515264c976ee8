"""Transformer-XL's relative positional attention, for the cores that own it.

Dai et al., "Transformer-XL: Attentive Language Models Beyond a
Fixed-Length Context" (arXiv 1901.02860), section 3.3. The logit of query i
and key j, with R_(i-j) the sinusoidal encoding of their offset:

  A_ij = q_i.k_j + q_i.W_R R_(i-j) + u.k_j + v.W_R R_(i-j)
       = (q_i + u).k_j  +  (q_i + v).(W_R R_(i-j))
          terms (a) + (c)      terms (b) + (d)

u and v are learned global biases (one [D] vector per head), W_R a learned
projection of the encoding. The whole logit is scaled by 1 / sqrt(D).

Keys may be longer than queries: the K keys are [memory; current segment]
and the L queries are the last L of them, so query i sits at key position
K - L + i and the offsets run from K - 1 (query L-1, key 0) down to
-(L - 1) (query 0, key K-1); causal use keeps offsets >= 0. Terms (b) + (d)
are computed once per distinct offset, [L, K + L - 1] per head, and moved to
[L, K] by the relative-shift trick (a pad, a reshape and a slice: no gather,
no [L, K, D] table of per-pair encodings). Cost: O(L K D) time and O(L K)
memory per head, as the exact core, plus the [K + L - 1, H, D] projected
encodings.

Differences from the paper: the encoding has the width H * D of the heads
(the core never sees the model width E), so W_R is [H*D, H*D]; negative
offsets are encoded (sin and cos of a negative position) so that the
attention can be bidirectional, as the LRA encoders are.

`model.positions='relative'` reaches a core through `with_relative`, which
sets the core's `relative` option; a core owns relative positions when its
constructor takes that option (softmax, transformer_xl,
compressive_transformer), and any other core refuses with one sentence.
"""

import inspect

from flax import nnx
import jax.numpy as jnp
import numpy as np

from models.attention.registry import get_core_class
from models.embeddings import sinusoidal_LxE
from models.errors import UserError


def owns_relative(name):
  """Whether the core `name` implements relative positions itself."""
  cls = get_core_class(name)
  return 'relative' in inspect.signature(cls.__init__).parameters


def with_relative(options):
  """The `model.attention` block with relative positions switched on, or one
  sentence when its core has no relative scheme."""
  name = options['name']
  if not owns_relative(name):
    raise UserError(
      f'Attention core {name!r} has no relative positions (softmax, '
      'transformer_xl and compressive_transformer have); set '
      '--config.model.positions to sinusoidal, learned, pia or rotary.'
    )
  return {**dict(options), 'relative': True}


def offsets_encoding_PxE(length_q, length_k, width):
  """float32 [K + L - 1, width]: the sinusoidal encoding of the offsets
  K - 1, K - 2, ..., -(L - 1) (descending: the order `relative_shift`
  expects). A trace-time constant."""
  table = sinusoidal_LxE(length_k + length_q - 1, width, -(length_q - 1))
  return np.ascontiguousarray(table[::-1])


def relative_shift(x_XxLxP, length_k):
  """y[..., i, j] = x[..., i, j + L - 1 - i] for j < K, with P = K + L - 1.

  Column p of x holds offset K - 1 - p; query i and key j have offset
  K - L + i - j, found at column j + L - 1 - i. Padding each row with one
  column and reading the flattened rows with a stride of P instead of P + 1
  moves row i left by i: the relative-shift trick of Transformer-XL.
  """
  *lead, length_q, p = x_XxLxP.shape
  widths = [(0, 0)] * len(lead) + [(0, 0), (0, 1)]
  flat = jnp.pad(x_XxLxP, widths).reshape(*lead, length_q * (p + 1))
  flat = flat[..., length_q - 1 : length_q - 1 + length_q * p]
  return flat.reshape(*lead, length_q, p)[..., :length_k]


class RelativePositions(nnx.Module):
  """The learned parts of relative attention: W_R, u and v."""

  def __init__(self, num_heads, head_dim, *, rngs):
    width = num_heads * head_dim
    self.num_heads, self.head_dim = num_heads, head_dim
    self.w_r_ExE = nnx.Param(
      nnx.initializers.xavier_uniform()(rngs.params(), (width, width))
    )
    # The authors' initialiser for u and v: normal, standard deviation 0.02.
    bias = nnx.initializers.normal(0.02)
    self.u_HxD = nnx.Param(bias(rngs.params(), (num_heads, head_dim)))
    self.v_HxD = nnx.Param(bias(rngs.params(), (num_heads, head_dim)))

  def logits(self, q_BxLxHxD, k_BxKxHxD):
    """float32 [B, H, L, K]: terms (a) + (b) + (c) + (d), unscaled; the
    queries are the last L of the K key positions."""
    length_q, length_k = q_BxLxHxD.shape[1], k_BxKxHxD.shape[1]
    h, d = self.num_heads, self.head_dim
    dtype = q_BxLxHxD.dtype
    r_PxE = jnp.asarray(offsets_encoding_PxE(length_q, length_k, h * d))
    r_PxHxD = (r_PxE @ self.w_r_ExE[...]).reshape(-1, h, d).astype(dtype)
    content_BxHxLxK = jnp.einsum(
      'blhd,bkhd->bhlk',
      q_BxLxHxD + self.u_HxD[...].astype(dtype),
      k_BxKxHxD,
      preferred_element_type=jnp.float32,
    )
    position_BxHxLxP = jnp.einsum(
      'blhd,phd->bhlp',
      q_BxLxHxD + self.v_HxD[...].astype(dtype),
      r_PxHxD,
      preferred_element_type=jnp.float32,
    )
    return content_BxHxLxK + relative_shift(position_BxHxLxP, length_k)


def zero_positions(core):
  """Sets W_R and u of every RelativePositions in `core` to zero: the logits
  become plain q.k (the exact limit of a relative core; for tests)."""
  for _, node in nnx.iter_graph(core):
    if isinstance(node, RelativePositions):
      node.w_r_ExE[...] = jnp.zeros_like(node.w_r_ExE[...])
      node.u_HxD[...] = jnp.zeros_like(node.u_HxD[...])
