"""Encoder: embeddings, optional CLS token, blocks, final LayerNorm.

With model.reversible the blocks run as reversible residual pairs
(models/reversible.py): activation memory independent of the depth.
"""

from flax import nnx
import jax.numpy as jnp

from lra.errors import UserError
from models.attention import Mask
from models.attention.base import dropout
from models.embeddings import Embedder
from models.layers import TransformerBlock, split_key
from models.reversible import reversible_blocks


class Encoder(nnx.Module):
  """tokens [B, L] -> (x [B, L(+1)], padding mask [B, L(+1)], aux)."""

  def __init__(self, cfg, *, vocab_size, max_length, pad_id, dtype, rngs):
    self.use_cls = cfg.pooling == 'cls'
    total = max_length + int(self.use_cls)
    self.embed = Embedder(
      vocab_size, cfg.emb_dim, total, cfg.positions, dtype=dtype, rngs=rngs
    )
    if self.use_cls:
      # Zeros, as the LRA reference; it gets position 0 (prepended before
      # the positions are added).
      self.cls_E = nnx.Param(jnp.zeros((cfg.emb_dim,), jnp.float32))
    self.blocks = nnx.List(
      [
        TransformerBlock(
          cfg, max_length=total, dtype=dtype, rngs=rngs, layer_index=i
        )
        for i in range(cfg.num_layers)
      ]
    )
    # Reversible residual blocks (models/reversible.py): the input is
    # duplicated into two streams and the output is their mean.
    self.reversible = getattr(cfg, 'reversible', False)
    if not isinstance(self.reversible, bool):
      raise UserError(
        f'model.reversible must be True or False, got {self.reversible!r}.'
      )
    self.ln_final = nnx.LayerNorm(cfg.emb_dim, dtype=dtype, rngs=rngs)
    self.pad_id = pad_id
    self.dropout_rate = cfg.dropout_rate
    self.dtype = dtype

  def __call__(self, tokens_BxL, *, key=None):
    b = tokens_BxL.shape[0]
    padding_BxL = None if self.pad_id is None else tokens_BxL != self.pad_id
    x_BxLxE = self.embed.embed(tokens_BxL)
    if self.use_cls:
      cls_Bx1xE = jnp.broadcast_to(
        self.cls_E[...].astype(self.dtype), (b, 1, x_BxLxE.shape[-1])
      )
      x_BxLxE = jnp.concatenate([cls_Bx1xE, x_BxLxE], axis=1)
      if padding_BxL is not None:
        padding_BxL = jnp.concatenate(
          [jnp.ones((b, 1), bool), padding_BxL], axis=1
        )
    x_BxLxE = self.embed.add_positions(x_BxLxE)
    keys = split_key(key, len(self.blocks) + 1)
    x_BxLxE = dropout(x_BxLxE, self.dropout_rate, keys[-1])
    mask = Mask(padding_BxL, causal=False)
    if self.reversible:
      x_BxLxE, aux_loss = reversible_blocks(self.blocks, x_BxLxE, mask, keys)
    else:
      aux_loss = jnp.zeros((), jnp.float32)
      for block, k in zip(self.blocks, keys):
        x_BxLxE, aux = block(x_BxLxE, mask, key=k)
        aux_loss = aux_loss + aux.get('loss', 0.0)
    return self.ln_final(x_BxLxE), padding_BxL, {'aux_loss': aux_loss}
