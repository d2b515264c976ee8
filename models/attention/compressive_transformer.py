"""Compressive Transformer: Transformer-XL plus a compressed older memory.

Rae et al., "Compressive Transformers for Long-Range Sequence Modelling"
(arXiv 1911.05507). As transformer_xl (models/attention/transformer_xl.py),
each layer attends over [SG(compressed memory); SG(memory); current
segment], with relative positions over that concatenation (one position per
compressed slot). When a segment of s tokens enters the memory, the s
oldest memories fall out of its window of m; instead of being discarded they
are compressed by the rate c into ceil(s / c) slots appended to a
compressed memory of the n_cm latest such slots:

  memory     <- last m of [memory; current]
  compressed <- last n_cm of [compressed; f_c(evicted)]

A token therefore sees about m + c * n_cm tokens back per layer. Cost per
segment and head: O(s (n_cm + m + s) D) time and O(s (n_cm + m + s)) memory.

f_c (`compression`), on the evicted keys and values, per group of c
consecutive slots (padding never enters a group's result):
  'max_pool', 'mean_pool'  over the group's valid slots;
  'conv1d'   (default) a learned kernel of width and stride c over the
             H * D features, one for keys and one for values, initialised
             to the mean (each tap the identity / c); a group of r < c
             valid slots (padding, or the tail of the evicted slots) is
             scaled by c / r, so it is the mean of its valid slots at the
             initialisation (the renormalisation of Liu et al.'s partial
             convolutions, arXiv 1804.07723: W^T (x * mask) c / r);
  'most_used' the ceil(s / c) evicted slots that received the most attention
             (summed over the heads and the segment's queries) in the
             segment that evicts them, kept in their order.
Attention-reconstruction loss (the paper's section 3.2): with the current
segment's queries, content attention (softmax(q.k / sqrt(D)) v, no
positions) over the evicted slots and over their compression must agree:

  L_attn = mean over real queries, heads, features of
           (attn(q, evicted) - attn(q, f_c(evicted)))^2

q and the evicted keys and values are stop-gradients, so the loss trains
only f_c and never the main network; the compressed memory enters later
segments as a stop-gradient too, so f_c learns from L_attn alone (as in
the paper, whose memories are stored across training steps).
aux['loss'] = aux_loss_weight * L_attn per layer and segment (the
segment-recurrent encoder sums it over layers and averages it over
segments; the train step adds it to the task loss). It is 0 for an
identity compression (rate 1: every f_c above, conv1d at its
initialisation).

Options: as transformer_xl (`memory_length` m, 0 = s, the default;
`causal`) plus `compressed_length` n_cm (0 = m, the default),
`compression_rate` c (default 3), `compression` (default 'conv1d') and
`aux_loss_weight` (default 1).
Exact limits: with no memory it is transformer_xl (and with zero W_R and u
plain softmax attention); with rate 1 and an identity compression it is
transformer_xl with memory m + n_cm (tests/test_recurrent.py). The memory
is recomputed for every example, never carried across batches.

Differences from the paper: the memories are the layer's keys and values
rather than its hidden states (see transformer_xl), so f_c compresses keys
and values with two kernels; conv1d's initialisation (the mean) is ours;
'most_used' counts the attention of the evicting segment only.
"""

from flax import nnx
import jax
import jax.numpy as jnp

from models.attention.base import int_option, pad_to_multiple
from models.attention.registry import register
from models.attention.transformer_xl import (
  TransformerXLAttention,
  content_attention,
  shift_memory,
)
from models.errors import UserError

COMPRESSIONS = ('max_pool', 'mean_pool', 'conv1d', 'most_used')


@register('compressive_transformer')
class CompressiveTransformerAttention(TransformerXLAttention):
  has_aux_loss = True
  rotary = 'scores'  # as transformer_xl: q and k at their input positions

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
    compressed_length=0,
    compression_rate=3,
    compression='conv1d',
    aux_loss_weight=1.0,
    causal=False,
    relative=False,
  ):
    super().__init__(
      num_heads=num_heads,
      head_dim=head_dim,
      max_length=max_length,
      dropout_rate=dropout_rate,
      dtype=dtype,
      rngs=rngs,
      layer_index=layer_index,
      memory_length=memory_length,
      causal=causal,
      relative=relative,
    )
    name = self.registry_name
    self.compressed_length = int_option(
      name, 'compressed_length', compressed_length, 0, 512
    )
    self.rate = int_option(name, 'compression_rate', compression_rate, 1, 3)
    if compression not in COMPRESSIONS:
      raise UserError(
        f'Unknown compression {compression!r} for {name}; use one of '
        f'{", ".join(COMPRESSIONS)} (--config.model.attention.compression).'
      )
    self.compression = compression
    if (
      isinstance(aux_loss_weight, bool)
      or not isinstance(aux_loss_weight, (int, float))
      or aux_loss_weight < 0
    ):
      raise UserError(
        f'{name} aux_loss_weight must be a number >= 0, got '
        f'{aux_loss_weight!r}; set e.g. '
        '--config.model.attention.aux_loss_weight=1.0.'
      )
    self.aux_loss_weight = float(aux_loss_weight)
    if compression == 'conv1d':
      width = num_heads * head_dim
      # [c, H*D, H*D]: one tap per slot of a group, each the identity / c
      # (two arrays: the train step donates every parameter's buffer).
      mean = lambda: jnp.tile(  # noqa: E731
        jnp.eye(width, dtype=jnp.float32)[None] / self.rate, (self.rate, 1, 1)
      )
      self.conv_k = nnx.Param(mean())
      self.conv_v = nnx.Param(mean())

  def compressed_size(self, segment_length):
    """n_cm: the option, or the memory length m when it is 0 (unset)."""
    return self.compressed_length or self.memory_size(segment_length)

  def initial_memory(self, batch, segment_length, dtype):
    memory = super().initial_memory(batch, segment_length, dtype)
    n = self.compressed_size(segment_length)
    shape = (batch, n, self.num_heads, self.head_dim)
    memory['ck_BxNxHxD'] = jnp.zeros(shape, dtype)
    memory['cv_BxNxHxD'] = jnp.zeros(shape, dtype)
    memory['cvalid_BxN'] = jnp.zeros((batch, n), bool)
    return memory

  def context(self, memory):
    keys, values, valid = super().context(memory)
    if memory is None:
      return keys, values, valid
    sg = jax.lax.stop_gradient
    return (
      [sg(memory['ck_BxNxHxD'])] + keys,
      [sg(memory['cv_BxNxHxD'])] + values,
      [memory['cvalid_BxN']] + valid,
    )

  def update(self, memory, q_BxLxHxD, k_BxLxHxD, v_BxLxHxD, valid_BxL, weights):
    kept, (old_k, old_v, old_valid) = shift_memory(
      memory, k_BxLxHxD, v_BxLxHxD, valid_BxL
    )
    usage_BxO = None
    if self.compression == 'most_used':
      # The evicted slots are the first of [memory; current], which start
      # after the compressed memory in the attended keys.
      start = memory['cvalid_BxN'].shape[1]
      usage_BxK = jnp.sum(weights, axis=(1, 2))
      usage_BxO = usage_BxK[:, start : start + old_valid.shape[1]]
    new_k, new_v, new_valid = self.compress(old_k, old_v, old_valid, usage_BxO)
    n = memory['cvalid_BxN'].shape[1]
    for name, new in (
      ('ck_BxNxHxD', new_k),
      ('cv_BxNxHxD', new_v),
      ('cvalid_BxN', new_valid),
    ):
      both = jnp.concatenate([memory[name], new.astype(memory[name].dtype)], 1)
      kept[name] = jax.lax.stop_gradient(both[:, both.shape[1] - n :])
    loss = reconstruction_loss(
      q_BxLxHxD, valid_BxL, (old_k, old_v, old_valid),
      (new_k, new_v, new_valid), self.scale,
    )  # fmt: skip
    return {'memory': kept, 'loss': self.aux_loss_weight * loss}

  def compress(self, k_BxOxHxD, v_BxOxHxD, valid_BxO, usage_BxO=None):
    """f_c of the O evicted slots -> ceil(O / c) slots (k, v, valid)."""
    c = self.rate
    b, o, h, d = k_BxOxHxD.shape
    n = -(-o // c)
    if self.compression == 'most_used':
      usage_BxO = jnp.where(valid_BxO, usage_BxO, -jnp.inf)
      _, top_BxN = jax.lax.top_k(usage_BxO, n)
      top_BxN = jnp.sort(top_BxN, axis=1)  # keep the time order
      take = lambda x: jnp.take_along_axis(  # noqa: E731
        x, top_BxN.reshape((b, n) + (1,) * (x.ndim - 2)), axis=1
      )
      return take(k_BxOxHxD), take(v_BxOxHxD), take(valid_BxO)

    def group(x):  # [B, O, ...] -> [B, N, c, ...], the tail padded
      return pad_to_multiple(x, c, axis=1).reshape((b, n, c) + x.shape[2:])

    valid_BxNxC = group(valid_BxO)
    valid_BxN = jnp.any(valid_BxNxC, axis=2)
    real = valid_BxNxC[..., None, None]
    out = []
    for x_BxOxHxD, kernel in (
      (k_BxOxHxD, getattr(self, 'conv_k', None)),
      (v_BxOxHxD, getattr(self, 'conv_v', None)),
    ):
      x_BxNxCxHxD = group(x_BxOxHxD)
      if self.compression == 'mean_pool':
        count = jnp.maximum(jnp.sum(real, axis=2), 1)
        y = jnp.sum(jnp.where(real, x_BxNxCxHxD, 0), axis=2) / count
      elif self.compression == 'max_pool':
        low = jnp.finfo(x_BxNxCxHxD.dtype).min
        y = jnp.max(jnp.where(real, x_BxNxCxHxD, low), axis=2)
        y = jnp.where(valid_BxN[..., None, None], y, 0)
      else:  # conv1d: width and stride c over the H * D features
        x_BxNxCxF = jnp.where(real, x_BxNxCxHxD, 0).reshape(b, n, c, h * d)
        y_BxNxF = jnp.einsum(
          'bncf,cfg->bng',
          x_BxNxCxF,
          kernel[...].astype(x_BxNxCxF.dtype),
          preferred_element_type=jnp.float32,
        )
        # Over the group's valid slots only: c / r for r of them (an empty
        # group stays 0 and invalid).
        count_BxNx1 = jnp.maximum(jnp.sum(valid_BxNxC, axis=2), 1)[..., None]
        y = (y_BxNxF * (c / count_BxNx1)).reshape(b, n, h, d)
      out.append(y.astype(x_BxOxHxD.dtype))
    return out[0], out[1], valid_BxN


def reconstruction_loss(q_BxLxHxD, real_BxL, old, new, scale):
  """The attention-reconstruction loss; gradients reach `new` only."""
  q = jax.lax.stop_gradient(q_BxLxHxD).astype(jnp.float32)
  old_k, old_v, old_valid = (jax.lax.stop_gradient(t) for t in old)
  new_k, new_v, new_valid = new
  f32 = lambda t: t.astype(jnp.float32)  # noqa: E731
  want = content_attention(q, f32(old_k), f32(old_v), old_valid, scale)
  got = content_attention(q, f32(new_k), f32(new_v), new_valid, scale)
  err_BxL = jnp.mean((got - want) ** 2, axis=(2, 3))
  real = real_BxL.astype(jnp.float32)
  return jnp.sum(err_BxL * real) / jnp.maximum(jnp.sum(real), 1.0)
