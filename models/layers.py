"""MultiHeadAttention around a core (or a sequence mixer in its place), the
feed-forward and pre-LN blocks."""

from flax import nnx
import jax
import jax.numpy as jnp

from models.attention import Mask, build
from models.attention.base import dropout, pad_to_multiple
from models.attention.registry import build_mixer, get_core_class, is_mixer
from models.attention.relative import with_relative
from models.errors import UserError
from models.mixers.base import zero_padded
from models.positions import check_rotary, pia_qk_inputs, rotate

# The LRA reference's initialisers for attention and feed-forward layers.
XAVIER = nnx.initializers.xavier_uniform()
TINY = nnx.initializers.normal(1e-6)


def split_key(key, n):
  """n keys from key, or n Nones when key is None (deterministic)."""
  if key is None:
    return [None] * n
  return list(jax.random.split(key, n))


class MultiHeadAttention(nnx.Module):
  """Projects to heads, runs the attention core, projects back."""

  def __init__(
    self,
    emb_dim,
    qkv_dim,
    num_heads,
    attention,
    *,
    max_length,
    dropout_rate,
    dtype,
    rngs,
    layer_index=0,
    positions='none',
  ):
    """positions: model.positions; this module applies the schemes that
    act inside attention ('pia', 'rotary'), the core owns 'relative'."""
    if qkv_dim % num_heads:
      raise ValueError(f'qkv_dim {qkv_dim} not divisible by {num_heads} heads')
    self.num_heads = num_heads
    self.head_dim = qkv_dim // num_heads
    if positions == 'relative':  # owned by the core, or one sentence
      attention = with_relative(attention)
    self.core = build(
      attention,
      num_heads=num_heads,
      head_dim=self.head_dim,
      max_length=max_length,
      dropout_rate=dropout_rate,
      dtype=dtype,
      rngs=rngs,
      layer_index=layer_index,
    )
    self.positions = positions
    if positions == 'rotary':  # before training starts: one sentence
      check_rotary(self.core, self.head_dim)
    # As the LRA reference: no bias, xavier_uniform kernels.
    linear = lambda i, o: nnx.Linear(  # noqa: E731
      i, o, use_bias=False, kernel_init=XAVIER, dtype=dtype, rngs=rngs
    )
    self.query = linear(emb_dim, qkv_dim)
    self.key = None if self.core.shared_qk else linear(emb_dim, qkv_dim)
    self.value = linear(emb_dim, qkv_dim)
    self.out = linear(qkv_dim, emb_dim)

  def __call__(self, x_BxLxE, mask, *, key=None, memory=None, offset=0):
    """offset: the position of x's first token under rotary positions (a
    recurrent encoder passes its segment's start, so cached keys and the
    current ones are rotated by their true positions: the scores see true
    offsets across segments)."""
    b, length, _ = x_BxLxE.shape
    heads = lambda t: t.reshape(b, -1, self.num_heads, self.head_dim)  # noqa: E731
    # pia (models/positions.py pia_qk_inputs): positions on the query and
    # key inputs only, 0 .. L-1 of this call's tokens; with a recurrent
    # core's memory of M slots, Shortformer's window [memory; segment]:
    # queries at M .. M+L-1, the keys passed position-free (the core caches
    # them) and their window positions in `extra`, which the core adds.
    q_in_BxLxE, k_in_BxLxE, extra = pia_qk_inputs(self, x_BxLxE, memory)
    q_BxLxHxD = heads(self.query(q_in_BxLxE))
    if getattr(self.core, 'projects_inputs', False) and self.key is not None:
      # Linformer: the length projection before the key and value
      # projections (bias-free), E^T (x W) = (E^T x) W, so W multiplies k
      # slots, not L rows (models/attention/linformer.py project_inputs;
      # such a core takes neither rotary positions nor memory).
      k_in_BxKxE, v_in_BxKxE = self.core.project_inputs(
        k_in_BxLxE, x_BxLxE, mask
      )
      k_BxLxHxD = heads(self.key(k_in_BxKxE))  # [B, k, H, D] here
      v_BxLxHxD = heads(self.value(v_in_BxKxE))
      extra = {**extra, 'projected': True}
    else:
      k_BxLxHxD = q_BxLxHxD if self.key is None else heads(self.key(k_in_BxLxE))
      v_BxLxHxD = heads(self.value(x_BxLxE))
    if self.positions == 'rotary':  # shared q/k: rotated once
      q_BxLxHxD = rotate(q_BxLxHxD, offset)
      k_BxLxHxD = q_BxLxHxD if self.key is None else rotate(k_BxLxHxD, offset)
    out_BxLxHxD, aux = self.core(
      q_BxLxHxD, k_BxLxHxD, v_BxLxHxD, mask, rngs=key, memory=memory, **extra
    )
    return self.out(out_BxLxHxD.reshape(b, length, -1)), aux


class MixerSublayer(nnx.Module):
  """A sequence mixer (models/mixers/) in the attention sub-layer's place,
  with MultiHeadAttention's call signature: the block's normalised input,
  zeroed at padded positions (the mixers' padding rule), goes to the mixer
  itself, and the output at padded positions is zero."""

  def __init__(
    self,
    emb_dim,
    num_heads,
    attention,
    *,
    max_length,
    dropout_rate,
    dtype,
    rngs,
    layer_index=0,
    positions='none',
  ):
    name = attention['name']
    if positions in ('pia', 'rotary', 'relative'):
      raise UserError(
        f'{name!r} is a sequence mixer and orders tokens itself; '
        f'model.positions={positions} acts inside attention: use '
        'model.positions=none or learned/sinusoidal.'
      )
    self.mixer = build_mixer(
      attention,
      emb_dim=emb_dim,
      num_heads=num_heads,
      max_length=max_length,
      dropout_rate=dropout_rate,
      dtype=dtype,
      rngs=rngs,
      layer_index=layer_index,
    )
    self.core = self.mixer  # what the builder's checks read (flags)

  def __call__(self, x_BxLxE, mask, *, key=None, memory=None, offset=0):
    del offset  # positions are the mixer's own
    if memory is not None:
      raise UserError(
        f'{self.mixer.registry_name!r} is a sequence mixer and keeps no '
        'segment memory; use model.segment_length=0.'
      )
    y_BxLxE, aux = self.mixer(zero_padded(x_BxLxE, mask), mask, rngs=key)
    return zero_padded(y_BxLxE, mask), aux


class ShortConv(nnx.Module):
  """model.short_conv=K: a depthwise causal convolution of width K on the
  block's (normalised) input, before the attention or mixing sub-layer.

  Zoology's short convolution (Arora, Eyuboglu et al. 2023, "Zoology:
  Measuring and Improving Recall in Efficient Language Models", arXiv
  2312.04927: the gated BaseConv with a width-3 ShortConvolution that its
  MQAR models put before attention), after H3's shift SSM (Fu, Dao et al.
  2022, "Hungry Hungry Hippos", arXiv 2212.14052); here the plain
  convolution, no gate and no residual:

    y_t = b + sum_{j=0}^{K-1} w_j * x_{t-j}   per channel, x_{t<0} = 0

  so position t sees t-K+1 .. t only (causal: the block's attention then
  compares a token with its predecessors, the two-step recall of an
  induction head in one layer). Padded positions are zeroed first (a pad
  never reaches a real token). Initialised with every tap 1/sqrt(K) and
  b = 0: each position starts as the scaled sum of its last K tokens, so
  queries and keys share the embedding dimensions of the token they match
  (a group-wise shift, channel group j copying the token j back, shows
  them disjoint dimensions of that token and learned MQAR slowest of the
  three tried; the identity, w_0 = 1 only, was no faster than this). No
  random draw: the rest of the model is initialised exactly as without
  the convolution. Time O(B L K E), memory
  O(B L E). The segment-recurrent encoder (transformer_xl, ...) convolves
  each segment alone: a segment's first K-1 tokens do not see the previous
  segment's last ones.
  """

  def __init__(self, emb_dim, width, *, dtype):
    # No random draw: the parameters of the rest of the model are those of
    # the model without the convolution. Every tap 1 / sqrt(K).
    self.kernel_KxE = nnx.Param(
      jnp.full((width, emb_dim), width**-0.5, jnp.float32)
    )
    self.bias_E = nnx.Param(jnp.zeros((emb_dim,), jnp.float32))
    self.width = width
    self.dtype = dtype

  def __call__(self, x_BxLxE, mask):
    x_BxLxE = zero_padded(x_BxLxE, mask)
    length = x_BxLxE.shape[1]
    w_KxE = self.kernel_KxE[...].astype(x_BxLxE.dtype)
    y_BxLxE = x_BxLxE * w_KxE[0] + self.bias_E[...].astype(x_BxLxE.dtype)
    for j in range(1, min(self.width, length)):  # tap j: the token j back
      shifted_BxLxE = jnp.pad(
        x_BxLxE[:, : length - j], ((0, 0), (j, 0), (0, 0))
      )
      y_BxLxE = y_BxLxE + shifted_BxLxE * w_KxE[j]
    return y_BxLxE


def short_conv(cfg, emb_dim, dtype):
  """The block's ShortConv of width model.short_conv, or None for 0 (the
  default, and configs made before the option): then the block is exactly
  the one without it. A bad width is one sentence."""
  width = cfg.get('short_conv', 0)
  if isinstance(width, bool) or not isinstance(width, int) or width < 0:
    raise UserError(
      f'model.short_conv must be an integer >= 0 (0: none), got {width!r}; '
      'e.g. --config.model.short_conv=2.'
    )
  return ShortConv(emb_dim, width, dtype=dtype) if width else None


def block_sublayer(cfg, max_length, dtype, rngs, layer_index):
  """A block's sequence-mixing sub-layer from the model config `cfg`."""
  return sequence_mixing(
    cfg.emb_dim,
    cfg.qkv_dim,
    cfg.num_heads,
    cfg.attention,
    max_length=max_length,
    dropout_rate=cfg.attention_dropout_rate,
    dtype=dtype,
    rngs=rngs,
    layer_index=layer_index,
    positions=cfg.positions,
  )


def sequence_mixing(emb_dim, qkv_dim, num_heads, attention, **kw):
  """The attention sub-layer of a block: MultiHeadAttention around an
  attention core, or a MixerSublayer around a sequence mixer (the
  registered class's `is_mixer` flag decides, nothing else)."""
  if is_mixer(get_core_class(attention['name'])):
    return MixerSublayer(emb_dim, num_heads, attention, **kw)
  return MultiHeadAttention(emb_dim, qkv_dim, num_heads, attention, **kw)


class Mlp(nnx.Module):
  """Dense(mlp) -> GELU -> Dense(emb), with the LRA reference's
  initialisers (xavier_uniform kernels, biases normal(1e-6))."""

  def __init__(self, emb_dim, mlp_dim, *, dropout_rate, dtype, rngs):
    linear = lambda i, o: nnx.Linear(  # noqa: E731
      i, o, kernel_init=XAVIER, bias_init=TINY, dtype=dtype, rngs=rngs
    )
    self.fc1 = linear(emb_dim, mlp_dim)
    self.fc2 = linear(mlp_dim, emb_dim)
    self.dropout_rate = dropout_rate

  def __call__(self, x_BxLxE, *, key=None):
    k1, k2 = split_key(key, 2)
    h = dropout(nnx.gelu(self.fc1(x_BxLxE)), self.dropout_rate, k1)
    return dropout(self.fc2(h), self.dropout_rate, k2)


class TransformerBlock(nnx.Module):
  """Pre-LayerNorm: x + attn(LN(x)), then x + mlp(LN(x))."""

  def __init__(self, cfg, *, max_length, dtype, rngs, layer_index=0):
    e = cfg.emb_dim
    self.ln_attn = nnx.LayerNorm(e, dtype=dtype, rngs=rngs)
    self.attn = block_sublayer(cfg, max_length, dtype, rngs, layer_index)
    self.ln_mlp = nnx.LayerNorm(e, dtype=dtype, rngs=rngs)
    self.mlp = Mlp(
      e, cfg.mlp_dim, dropout_rate=cfg.dropout_rate, dtype=dtype, rngs=rngs
    )
    self.dropout_rate = cfg.dropout_rate
    self.ffn_chunks = checked_ffn_chunks(cfg)
    # model.short_conv > 0: ShortConv on LN(x) before the attention (None:
    # off, the model is exactly the one without).
    self.short_conv = short_conv(cfg, e, dtype)

  def __call__(self, x_BxLxE, mask: Mask, *, key=None, memory=None, offset=0):
    """-> (x, aux); memory: a recurrent core's memory of the previous
    segments, whose next state comes back in aux['memory']; offset: the
    segment's first position (rotary positions)."""
    k_attn, k_drop, k_mlp = split_key(key, 3)
    h_BxLxE, aux = self.attention_branch(
      x_BxLxE,
      mask,
      key=k_attn,
      dropout_key=k_drop,
      memory=memory,
      offset=offset,
    )
    x_BxLxE = x_BxLxE + h_BxLxE
    x_BxLxE = x_BxLxE + self.mlp_branch(x_BxLxE, key=k_mlp)
    return x_BxLxE, aux

  def attention_branch(
    self, x_BxLxE, mask, *, key=None, dropout_key=None, memory=None, offset=0
  ):
    """dropout(attn(LN(x))) and the core's aux: the first residual branch.

    key: the attention core's call-time key; dropout_key: the residual
    dropout's (None: deterministic); memory: passed to the core.
    """
    h_BxLxE = self.ln_attn(x_BxLxE)
    if self.short_conv is not None:  # model.short_conv
      h_BxLxE = self.short_conv(h_BxLxE, mask)
    h_BxLxE, aux = self.attn(
      h_BxLxE, mask, key=key, memory=memory, offset=offset
    )
    return dropout(h_BxLxE, self.dropout_rate, dropout_key), aux

  def mlp_branch(self, x_BxLxE, *, key=None):
    """mlp(LN(x)): the second residual branch, in ffn_chunks along L.

    With n > 1 chunks the length is padded to a multiple of n and a
    `jax.lax.scan` runs one rematerialised chunk at a time, so only one
    chunk's hidden activations [B, L/n, mlp_dim] are alive at once, in the
    forward and in the backward pass (at the price of recomputing them).
    LayerNorm and MLP act per token, so the result is the same as n = 1;
    dropout draws from one key per chunk (split from `key`): the same
    distribution, other masks.
    """
    n = self.ffn_chunks
    if n == 1:
      return self.mlp(self.ln_mlp(x_BxLxE), key=key)
    b, length, e = x_BxLxE.shape
    x_BxPxE = pad_to_multiple(x_BxLxE, n, axis=1)
    c = x_BxPxE.shape[1] // n
    x_NxBxCxE = x_BxPxE.reshape(b, n, c, e).transpose(1, 0, 2, 3)
    keys = None if key is None else jax.random.split(key, n)
    graphdef, state = nnx.split((self.ln_mlp, self.mlp))

    @jax.checkpoint
    def chunk(state, x_BxCxE, k):
      ln, mlp = nnx.merge(graphdef, state)
      return mlp(ln(x_BxCxE), key=k)

    def body(carry, xs):
      return carry, chunk(state, *xs)

    _, out_NxBxCxE = jax.lax.scan(body, None, (x_NxBxCxE, keys))
    out_BxPxE = out_NxBxCxE.transpose(1, 0, 2, 3).reshape(b, n * c, e)
    return out_BxPxE[:, :length]


class SSMBlock(nnx.Module):
  """The block the S4 and S5 papers train on LRA (model.block=ssm): norm,
  sequence mixing, dropout, residual, and no separate feed-forward (the
  mixers end with their own GELU or GLU and output projection).

    pre-norm  (model.prenorm=True):  x + dropout(mix(norm(x)))
    post-norm (model.prenorm=False): norm(x + dropout(mix(x)))

  model.norm: 'layer' (LayerNorm) or 'batch' (BatchNorm over the batch and
  the real positions, padded ones masked out; running averages, momentum
  0.9, at evaluation, i.e. when no key is given). Any registered core or
  mixer can sit in it; the papers' are s4d and s5.
  """

  def __init__(self, cfg, *, max_length, dtype, rngs, layer_index=0):
    e = cfg.emb_dim
    self.norm_kind = cfg.get('norm', 'layer')
    self.prenorm = cfg.get('prenorm', True)
    if self.norm_kind not in ('layer', 'batch'):
      raise UserError(
        f'model.norm must be layer or batch, got {self.norm_kind!r}.'
      )
    if not isinstance(self.prenorm, bool):
      raise UserError(
        f'model.prenorm must be True or False, got {self.prenorm!r}.'
      )
    if self.norm_kind == 'batch':
      self.norm = nnx.BatchNorm(e, momentum=0.9, dtype=dtype, rngs=rngs)
    else:
      self.norm = nnx.LayerNorm(e, dtype=dtype, rngs=rngs)
    self.attn = block_sublayer(cfg, max_length, dtype, rngs, layer_index)
    self.dropout_rate = cfg.dropout_rate
    # model.short_conv > 0: ShortConv on the mixer's input (None: off).
    self.short_conv = short_conv(cfg, e, dtype)

  def normalise(self, x_BxLxE, mask, training):
    if self.norm_kind == 'layer':
      return self.norm(x_BxLxE)
    real = mask.key_padding_BxM
    return self.norm(
      x_BxLxE,
      use_running_average=not training,
      mask=None if real is None else real[:, :, None],
    )

  def __call__(self, x_BxLxE, mask: Mask, *, key=None, memory=None, offset=0):
    """-> (x, aux), as TransformerBlock."""
    k_mix, k_drop = split_key(key, 2)
    training = key is not None
    h_BxLxE = (
      self.normalise(x_BxLxE, mask, training) if self.prenorm else x_BxLxE
    )
    if self.short_conv is not None:  # model.short_conv
      h_BxLxE = self.short_conv(h_BxLxE, mask)
    h_BxLxE, aux = self.attn(
      h_BxLxE, mask, key=k_mix, memory=memory, offset=offset
    )
    x_BxLxE = x_BxLxE + dropout(h_BxLxE, self.dropout_rate, k_drop)
    if not self.prenorm:
      x_BxLxE = self.normalise(x_BxLxE, mask, training)
    return x_BxLxE, aux


BLOCKS = {'transformer': TransformerBlock, 'ssm': SSMBlock}


def block_class(cfg):
  """The block of model.block: 'transformer' (pre-LN attention + MLP) or
  'ssm' (the S4/S5 papers' block), or one sentence."""
  name = cfg.get('block', 'transformer')
  if name not in BLOCKS:
    raise UserError(
      f'model.block must be one of {", ".join(BLOCKS)}, got {name!r}.'
    )
  return BLOCKS[name]


def checked_ffn_chunks(cfg):
  """cfg.ffn_chunks, checked (1 when the config predates the option)."""
  n = getattr(cfg, 'ffn_chunks', 1)
  if isinstance(n, bool) or not isinstance(n, int) or n < 1:
    raise UserError(
      f'model.ffn_chunks must be a positive integer, got {n!r}; use 1 for '
      'no chunking.'
    )
  return n


def as_dtype(name):
  try:
    return {'float32': jnp.float32, 'bfloat16': jnp.bfloat16}[name]
  except KeyError:
    raise UserError(
      f'Unknown dtype {name!r}; use float32 or bfloat16.'
    ) from None
