"""Token embeddings and the position schemes.

`model.positions` picks one scheme for the whole model:
  absolute, added to the token embeddings here (after the CLS token is
  prepended, so the CLS has position 0, as in the LRA reference):
    'sinusoidal'  the fixed encoding of Vaswani et al.;
    'learned'     a trained table of max_length (+1 for the CLS) rows;
    'none'        no positions at all;
  applied inside attention, nothing added here (models/positions.py and the
  cores that own a relative scheme):
    'relative'    Transformer-XL's relative encoding (Dai et al. 2019);
    'pia'         position-infused attention (Shortformer, Press et al. 2021);
    'rotary'      rotary embeddings (RoFormer, Su et al. 2021).
"""

from flax import nnx
import jax.numpy as jnp
import numpy as np

from errors import UserError

ABSOLUTE = ('sinusoidal', 'learned', 'none')
IN_ATTENTION = ('relative', 'pia', 'rotary')
POSITIONS = ABSOLUTE + IN_ATTENTION


def check_positions(positions):
  """positions if it names a scheme, else one sentence."""
  if positions not in POSITIONS:
    raise UserError(
      f'Unknown positions {positions!r}; use one of {", ".join(POSITIONS)} '
      '(--config.model.positions).'
    )
  return positions


def sinusoidal_LxE(length, dim, offset=0):
  """The fixed encoding of Vaswani et al.: sin on even, cos on odd features,
  for positions offset .. offset + length - 1."""
  pos = np.arange(offset, offset + length)[:, None]
  inv = np.exp(-np.log(10000.0) * np.arange(0, dim, 2) / dim)
  table = np.zeros((length, dim), np.float32)
  table[:, 0::2] = np.sin(pos * inv)
  table[:, 1::2] = np.cos(pos * inv)[:, : dim // 2]
  return table


class Embedder(nnx.Module):
  """Token ids -> vectors (`embed`), then absolute positions (`add_positions`).

  The two steps are apart so that the encoder can prepend its CLS token in
  between: the CLS gets position 0 and the table has a row for it.
  """

  def __init__(
    self, vocab_size, emb_dim, max_length, positions, *, dtype, rngs
  ):
    """max_length: rows of the learned table (the CLS included)."""
    self.tokens = nnx.Embed(
      vocab_size,
      emb_dim,
      dtype=dtype,
      rngs=rngs,
      embedding_init=nnx.initializers.normal(1.0),
    )
    self.positions = check_positions(positions)
    self.max_length = max_length
    if positions == 'learned':
      self.pos_LxE = nnx.Param(
        nnx.initializers.normal(0.02)(rngs.params(), (max_length, emb_dim))
      )
    self.dtype = dtype

  def embed(self, tokens_BxL):
    return self.tokens(tokens_BxL)

  def add_positions(self, x_BxLxE, offset=0):
    """x plus the absolute positions offset .. offset + L - 1 (identity for
    'none' and the schemes applied inside attention)."""
    if self.positions not in ('sinusoidal', 'learned'):
      return x_BxLxE
    length = x_BxLxE.shape[1]
    if offset + length > self.max_length:
      raise ValueError(
        f'length {offset + length} > max_length {self.max_length}'
      )
    if self.positions == 'learned':
      pos_LxE = self.pos_LxE[...][offset : offset + length]
    else:  # A trace-time constant: derivable, so never checkpointed.
      pos_LxE = jnp.asarray(
        sinusoidal_LxE(length, x_BxLxE.shape[-1], offset)
      )
    return x_BxLxE + pos_LxE.astype(self.dtype)

  def __call__(self, tokens_BxL):
    return self.add_positions(self.embed(tokens_BxL))
