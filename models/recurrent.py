"""Segment-recurrent encoder: the input in segments, a memory per layer.

For the recurrent attention cores (the `recurrent` flag of
models/attention/base.py: transformer_xl, compressive_transformer; the
builder in models/classifier.py picks this encoder by that flag). Same
embeddings, blocks and final LayerNorm as the parallel Encoder
(models/encoder.py), and the same outputs, so the heads and pooling are
shared:

  tokens [B, L] -> embed (+ CLS) (+ absolute positions over the whole input)
    -> T tokens, padded to S = ceil(T / s) segments of s = model.segment_length
    -> jax.lax.scan over the S segments; in segment t, block n runs on the
       segment with its core's memory of the previous segments and returns
       the next memory (aux['memory']): the carry is one memory per layer
    -> the final layer's outputs of all segments, final LayerNorm
    -> x [B, 1 + L, E] (CLS first, as the parallel encoder) or [B, L, E].

Segments are one program compiled once (the scan's body), so compile time
does not grow with the length; compute and memory grow linearly in S at
fixed s and memory length. The memory starts empty for every input: it is
recomputed per example and never carried across batches, so resuming a run
from a checkpoint gives exactly the uninterrupted run.

CLS: in a left-to-right recurrence a token sees only what comes before it
(its own segment, and the memory of the previous ones), so a CLS at the
start would see only the first segment. The CLS token is therefore placed
right after each input's last real token (at position n_b for n_b real
tokens, trailing padding), where it sees its segment and the memory; it is
returned at index 0, as the parallel encoder's, and the heads read it from
there. 'mean' and 'max' pool the final outputs of every real token of
every segment.

Padding: padded tokens are masked as keys in their segment and in the
memory (the cores keep a validity flag per memory slot), so fully padded
segments and the padding added to reach a multiple of s change no real
output. Absolute positions ('sinusoidal', 'learned') are those of the whole
input; 'relative' is the cores' own (offsets within [memory; segment]);
'rotary' is applied by MultiHeadAttention at the tokens' positions in the
whole input (segment t starts at t s), so a cached key keeps the rotation
of its true position and q.k scores see true offsets across segments;
'pia' is over Shortformer's window [memory; segment] (models/positions.py):
in every segment the M memory slots' keys at 0 .. M-1, the segment's
queries and keys at M .. M+L-1 (the memory caches position-free keys).

model.segment_remat wraps a segment's blocks in jax.checkpoint: the
backward pass recomputes them from the segment's input and memory, so the
activations of only one segment are alive at once (the memory is a
stop-gradient, so no gradient crosses segments and this is exact).

Dropout keys: fold_in(key, segment), split per layer. Not supported:
reversible blocks (model.reversible), which rebuild activations from the
outputs and have no place for a memory.
"""

from flax import nnx
import jax
import jax.numpy as jnp

from models.attention import Mask
from models.attention.base import dropout, pad_to_multiple
from models.embeddings import Embedder
from models.errors import UserError
from models.layers import TransformerBlock, split_key


def checked_segment_length(cfg):
  """cfg.segment_length if it is an integer >= 1, else one sentence."""
  s = cfg.get('segment_length', None)
  if isinstance(s, bool) or not isinstance(s, int) or s < 1:
    raise UserError(
      f'model.segment_length must be an integer >= 1, got {s!r}; set e.g. '
      '--config.model.segment_length=512.'
    )
  return s


class SegmentRecurrentEncoder(nnx.Module):
  """tokens [B, L] -> (x [B, L(+1), E], padding mask [B, L(+1)], aux)."""

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
    # A causal mask in every layer (causal_lm, models/lm.py).
    self.causal = causal
    if getattr(cfg, 'reversible', False):
      raise UserError(
        f'Reversible blocks cannot carry the memory of the recurrent core '
        f'{cfg.attention["name"]!r}; set --config.model.reversible=False.'
      )
    if cfg.get('remat', False) or cfg.get('scan_layers', False):
      raise UserError(
        f'The recurrent core {cfg.attention["name"]!r} runs its blocks per '
        'segment; use --config.model.segment_remat=True instead of '
        'model.remat or model.scan_layers.'
      )
    self.use_cls = cfg.pooling == 'cls'
    total = max_length + int(self.use_cls)
    # No segment longer than the input: one segment is then the whole input.
    self.segment_length = min(checked_segment_length(cfg), total)
    self.remat = cfg.get('segment_remat', False)
    if not isinstance(self.remat, bool):
      raise UserError(
        f'model.segment_remat must be True or False, got {self.remat!r}.'
      )
    self.embed = Embedder.of(cfg, vocab_size, total, dtype=dtype, rngs=rngs)
    if self.use_cls:
      self.cls_E = nnx.Param(jnp.zeros((cfg.emb_dim,), jnp.float32))
    self.blocks = nnx.List(
      [
        TransformerBlock(
          cfg,
          max_length=self.segment_length,
          dtype=dtype,
          rngs=rngs,
          layer_index=i,
        )
        for i in range(cfg.num_layers)
      ]
    )
    for block in self.blocks:
      if not block.attn.core.recurrent:
        raise ValueError('SegmentRecurrentEncoder needs a recurrent core')
    self.ln_final = nnx.LayerNorm(cfg.emb_dim, dtype=dtype, rngs=rngs)
    self.pad_id = pad_id
    self.dropout_rate = cfg.dropout_rate
    self.dtype = dtype

  def __call__(self, tokens_BxL, *, key=None):
    b, length = tokens_BxL.shape
    padding_BxL = None if self.pad_id is None else tokens_BxL != self.pad_id
    real_BxL = (
      jnp.ones((b, length), bool) if padding_BxL is None else padding_BxL
    )
    x_BxTxE = self.embed.embed(tokens_BxL)
    real_BxT = real_BxL
    if self.use_cls:
      x_BxTxE, real_BxT, cls_at_B = self.insert_cls(x_BxTxE, real_BxL)
    x_BxTxE = self.embed.add_positions(x_BxTxE)
    k_embed, k_blocks = split_key(key, 2)
    x_BxTxE = dropout(x_BxTxE, self.dropout_rate, k_embed)
    out_BxTxE, aux_loss = self.run_segments(x_BxTxE, real_BxT, k_blocks)
    out_BxTxE = self.ln_final(out_BxTxE)
    if not self.use_cls:
      return out_BxTxE, padding_BxL, {'aux_loss': aux_loss}
    cls_Bx1xE = jnp.take_along_axis(out_BxTxE, cls_at_B[:, None, None], axis=1)
    x_BxLxE = jnp.concatenate([cls_Bx1xE, out_BxTxE[:, :length]], axis=1)
    if padding_BxL is not None:
      padding_BxL = jnp.concatenate(
        [jnp.ones((b, 1), bool), padding_BxL], axis=1
      )
    return x_BxLxE, padding_BxL, {'aux_loss': aux_loss}

  def insert_cls(self, x_BxLxE, real_BxL):
    """(x [B, L+1, E], real [B, L+1], cls position [B]): the CLS token put
    right after the last real token (at 0 when there is none)."""
    b, length, e = x_BxLxE.shape
    after_last_B = jnp.max(
      jnp.where(real_BxL, jnp.arange(1, length + 1)[None, :], 0), axis=1
    )
    x_BxTxE = jnp.concatenate([x_BxLxE, jnp.zeros((b, 1, e), x_BxLxE.dtype)], 1)
    at_BxT = jnp.arange(length + 1)[None, :] == after_last_B[:, None]
    cls_E = self.cls_E[...].astype(x_BxTxE.dtype)
    x_BxTxE = jnp.where(at_BxT[:, :, None], cls_E, x_BxTxE)
    real_BxT = jnp.concatenate([real_BxL, jnp.zeros((b, 1), bool)], 1) | at_BxT
    return x_BxTxE, real_BxT, after_last_B

  def run_segments(self, x_BxTxE, real_BxT, key):
    """The blocks over S segments in a scan: (final-layer outputs [B, T, E]
    before the final LayerNorm, aux loss summed over layers, averaged over
    segments)."""
    b, total, e = x_BxTxE.shape
    s = self.segment_length
    x_BxPxE = pad_to_multiple(x_BxTxE, s, axis=1)
    real_BxP = pad_to_multiple(real_BxT, s, axis=1, value=False)
    n = x_BxPxE.shape[1] // s
    x_SxBxCxE = x_BxPxE.reshape(b, n, s, e).swapaxes(0, 1)
    real_SxBxC = real_BxP.reshape(b, n, s).swapaxes(0, 1)
    memories = tuple(
      block.attn.core.initial_memory(b, s, x_BxTxE.dtype)
      for block in self.blocks
    )
    graphdef, state = nnx.split(self.blocks)
    num_layers = len(self.blocks)

    def segment(carry, inputs):
      memories, aux_loss = carry
      x_BxCxE, real_BxC, index = inputs
      blocks = nnx.merge(graphdef, state)
      seg_key = None if key is None else jax.random.fold_in(key, index)
      mask = Mask(real_BxC, causal=self.causal)
      new = []
      for block, memory, k in zip(
        blocks, memories, split_key(seg_key, num_layers)
      ):
        x_BxCxE, aux = block(
          x_BxCxE, mask, key=k, memory=memory, offset=index * s
        )
        new.append(aux['memory'])
        aux_loss = aux_loss + aux.get('loss', 0.0)
      return (tuple(new), aux_loss), x_BxCxE

    carry = (memories, jnp.zeros((), jnp.float32))
    body = jax.checkpoint(segment) if self.remat else segment
    (_, aux_loss), out_SxBxCxE = jax.lax.scan(
      body, carry, (x_SxBxCxE, real_SxBxC, jnp.arange(n))
    )
    out_BxPxE = out_SxBxCxE.swapaxes(0, 1).reshape(b, n * s, e)
    return out_BxPxE[:, :total], aux_loss / n
