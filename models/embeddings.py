"""Token embeddings and absolute positions (sinusoidal, learned, none)."""

from flax import nnx
import jax.numpy as jnp
import numpy as np

from lra.errors import UserError

POSITIONS = ('sinusoidal', 'learned', 'none')


def sinusoidal_LxE(length, dim):
  """The fixed encoding of Vaswani et al.: sin on even, cos on odd features."""
  pos = np.arange(length)[:, None]
  inv = np.exp(-np.log(10000.0) * np.arange(0, dim, 2) / dim)
  table = np.zeros((length, dim), np.float32)
  table[:, 0::2] = np.sin(pos * inv)
  table[:, 1::2] = np.cos(pos * inv)[:, : dim // 2]
  return table


class Embedder(nnx.Module):
  """Token ids -> vectors, plus absolute positions."""

  def __init__(
    self, vocab_size, emb_dim, max_length, positions, *, dtype, rngs
  ):
    if positions not in POSITIONS:
      raise UserError(
        f'Unknown positions {positions!r}; use one of {", ".join(POSITIONS)}.'
      )
    self.tokens = nnx.Embed(
      vocab_size,
      emb_dim,
      dtype=dtype,
      rngs=rngs,
      embedding_init=nnx.initializers.normal(1.0),
    )
    self.positions = positions
    self.max_length = max_length
    if positions == 'learned':
      self.pos_LxE = nnx.Param(
        nnx.initializers.normal(0.02)(rngs.params(), (max_length, emb_dim))
      )
    self.dtype = dtype

  def __call__(self, tokens_BxL):
    x_BxLxE = self.tokens(tokens_BxL)
    if self.positions != 'none':
      length = tokens_BxL.shape[1]
      if length > self.max_length:
        raise ValueError(f'length {length} > max_length {self.max_length}')
      if self.positions == 'learned':
        pos_LxE = self.pos_LxE[...][:length]
      else:  # A trace-time constant: derivable, so never checkpointed.
        pos_LxE = jnp.asarray(sinusoidal_LxE(length, x_BxLxE.shape[-1]))
      x_BxLxE = x_BxLxE + pos_LxE.astype(self.dtype)
    return x_BxLxE
