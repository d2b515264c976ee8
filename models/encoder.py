"""Encoder: embeddings, optional CLS token, blocks, final LayerNorm.

With model.reversible the blocks run as reversible residual pairs
(models/reversible.py): activation memory independent of the depth.

With model.remat each block is rematerialised (jax.checkpoint; Chen et
al. 2016, "Training Deep Nets with Sublinear Memory
Cost"): the backward pass keeps only the blocks' inputs and recomputes the
rest. With model.scan_layers the blocks' parameters are stacked along a
leading layer axis and run by one jax.lax.scan, so the step compiles one
block whatever the depth (the checkpoint layout differs from the plain
model's: `blocks` holds one block whose leaves are [num_layers, ...]). Both
give the plain model's loss and gradients; the blocks are built exactly as
the plain model's, then stacked, so the same seed gives the same numbers.
"""

from flax import nnx
import jax
import jax.numpy as jnp
import ml_collections

from models.attention import Mask
from models.attention.base import dropout
from models.attention.registry import check_per_layer, get_core_class
from models.embeddings import Embedder
from models.errors import UserError
from models.layers import TransformerBlock, block_class, split_key
from models.reversible import reversible_blocks


class Encoder(nnx.Module):
  """tokens [B, L] -> (x [B, L(+1)], padding mask [B, L(+1)], aux)."""

  def __init__(
    self,
    cfg,
    *,
    vocab_size,
    max_length,
    pad_id,
    dtype,
    rngs,
    causal=False,
  ):
    self.use_cls = cfg.pooling == 'cls'
    # A causal mask in every layer (causal_lm, models/lm.py).
    self.causal = causal
    # Issue #21: options the core resolves from the model (Longformer's
    # global_positions='auto' from the pooling) and the learned tokens it
    # wants prepended (BigBird ETC's global tokens): attention_for_model.
    cfg, self.num_extra = attention_for_model(cfg, causal)
    total = max_length + int(self.use_cls)
    self.embed = Embedder.of(cfg, vocab_size, total, dtype=dtype, rngs=rngs)
    if self.use_cls:
      # Zeros, as the LRA reference; it gets position 0 (prepended before
      # the positions are added).
      self.cls_E = nnx.Param(jnp.zeros((cfg.emb_dim,), jnp.float32))
    block = block_class(cfg)  # model.block: transformer or ssm
    self.blocks = nnx.List(
      [
        block(
          cfg,
          max_length=total + self.num_extra,  # + the ETC tokens (#21)
          dtype=dtype,
          rngs=rngs,
          layer_index=i,
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
    if self.reversible and block is not TransformerBlock:
      raise UserError(
        'Reversible blocks pair an attention and a feed-forward branch; '
        'model.block=ssm has no feed-forward: set '
        '--config.model.reversible=False.'
      )
    self.num_layers = cfg.num_layers
    self.remat = checked_bool(cfg, 'remat')
    self.scan_layers = checked_bool(cfg, 'scan_layers')
    if self.reversible and (self.remat or self.scan_layers):
      raise UserError(
        'Reversible blocks already rebuild their activations in the '
        'backward pass; set --config.model.remat=False and '
        '--config.model.scan_layers=False with model.reversible.'
      )
    if self.scan_layers:
      self.blocks = stack_blocks(self.blocks, cfg.attention['name'])
    self.ln_final = nnx.LayerNorm(cfg.emb_dim, dtype=dtype, rngs=rngs)
    self.pad_id = pad_id
    self.dropout_rate = cfg.dropout_rate
    self.dtype = dtype
    if self.num_extra:
      # ETC global tokens (issue #21): learned, position-free, N(0, 1) like
      # the token embeddings (distinct, so they do not stay symmetric);
      # drawn last, so the rest of the model is initialised as without.
      # A fine-tune from a model without them keeps this initial value
      # (lra/train/pretrained.py reads `init_from_missing`).
      self.extra_GxE = nnx.Param(
        jax.random.normal(rngs.params(), (self.num_extra, cfg.emb_dim)),
        init_from_missing='fresh (learned global tokens)',
      )

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
    if self.num_extra:  # ETC global tokens first, never padding (#21)
      g = self.num_extra
      extra_BxGxE = jnp.broadcast_to(
        self.extra_GxE[...].astype(x_BxLxE.dtype), (b, g, x_BxLxE.shape[-1])
      )
      x_BxLxE = jnp.concatenate([extra_BxGxE, x_BxLxE], axis=1)
      if padding_BxL is not None:
        padding_BxL = jnp.concatenate(
          [jnp.ones((b, g), bool), padding_BxL], axis=1
        )
    keys = split_key(key, self.num_layers + 1)
    x_BxLxE = dropout(x_BxLxE, self.dropout_rate, keys[-1])
    mask = Mask(padding_BxL, causal=self.causal)
    if self.reversible:
      x_BxLxE, aux_loss = reversible_blocks(self.blocks, x_BxLxE, mask, keys)
    elif self.scan_layers:
      x_BxLxE, aux_loss = scanned_blocks(
        self.blocks, x_BxLxE, mask, keys[:-1], remat=self.remat
      )
    elif self.remat:
      aux_loss = jnp.zeros((), jnp.float32)
      for block, k in zip(self.blocks, keys):
        x_BxLxE, aux = rematerialised(block, x_BxLxE, mask, k)
        aux_loss = aux_loss + aux_loss_of(aux)
    else:
      aux_loss = jnp.zeros((), jnp.float32)
      for block, k in zip(self.blocks, keys):
        x_BxLxE, aux = block(x_BxLxE, mask, key=k)
        aux_loss = aux_loss + aux.get('loss', 0.0)
    x_BxLxE = self.ln_final(x_BxLxE)
    if self.num_extra:  # the ETC global tokens are not returned (#21)
      x_BxLxE = x_BxLxE[:, self.num_extra :]
      if padding_BxL is not None:
        padding_BxL = padding_BxL[:, self.num_extra :]
    return x_BxLxE, padding_BxL, {'aux_loss': aux_loss}


def attention_for_model(cfg, causal):
  """(cfg, extra tokens) for the attention core of cfg (issue #21).

  cfg with the options its core class resolves from the model, when the
  class has model_options(options, pooling=, causal=) (Longformer's
  global_positions='auto': the CLS with CLS pooling, none with mean
  pooling), as a copy (the caller's config is not changed); and how many
  learned tokens the encoder prepends for it, from the class's
  extra_tokens(options) (BigBird ETC's num_global_tokens), else 0.
  """
  cls = get_core_class(cfg.attention['name'])
  options = dict(cfg.attention)
  check_per_layer(options, cfg.num_layers)
  resolve = getattr(cls, 'model_options', None)
  if resolve is not None:
    resolved = resolve(options, pooling=cfg.pooling, causal=causal)
    if resolved != options:
      cfg = cfg.copy_and_resolve_references()
      with cfg.unlocked():
        cfg.attention = ml_collections.ConfigDict(resolved)
  extra = getattr(cls, 'extra_tokens', None)
  return cfg, (extra(options) if extra is not None else 0)


def checked_bool(cfg, name):
  """cfg.<name> (False when the config predates it), or one sentence."""
  value = cfg.get(name, False)
  if not isinstance(value, bool):
    raise UserError(f'model.{name} must be True or False, got {value!r}.')
  return value


def rematerialised(block, x_BxLxE, mask, key):
  """block(x, mask, key=key) under jax.checkpoint: its activations are
  recomputed in the backward pass instead of kept. (The mask is closed over:
  its static fields stay Python values.)"""
  graphdef, state = nnx.split(block)

  @jax.checkpoint
  def run(state, x_BxLxE, key):
    return nnx.merge(graphdef, state)(x_BxLxE, mask, key=key)

  return run(state, x_BxLxE, key)


def aux_loss_of(aux):
  return jnp.asarray(aux.get('loss', 0.0), jnp.float32)


def stack_blocks(blocks, attention):
  """One block whose every leaf is the blocks' leaves stacked on a leading
  layer axis; one sentence when the blocks differ in structure (an
  attention whose layers are not alike)."""
  splits = [nnx.split(b) for b in blocks]
  graphdef = splits[0][0]
  if any(g != graphdef for g, _ in splits[1:]):
    raise UserError(
      f'model.scan_layers needs identical blocks, but the {attention!r} '
      "attention's layers differ; set --config.model.scan_layers=False."
    )
  stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *[st for _, st in splits])
  return nnx.merge(graphdef, stacked)


def scanned_blocks(stacked, x_BxLxE, mask, keys, *, remat):
  """Runs the stacked blocks in order with one jax.lax.scan (each step
  rematerialised with `remat`); -> (x, summed aux loss)."""
  graphdef, state = nnx.split(stacked)
  keys_N = None if keys[0] is None else jnp.stack(keys)

  def body(x_BxLxE, layer):
    state, key = layer
    x_BxLxE, aux = nnx.merge(graphdef, state)(x_BxLxE, mask, key=key)
    return x_BxLxE, aux_loss_of(aux)

  body = jax.checkpoint(body) if remat else body
  x_BxLxE, losses_N = jax.lax.scan(body, x_BxLxE, (state, keys_N))
  return x_BxLxE, jnp.sum(losses_N)
