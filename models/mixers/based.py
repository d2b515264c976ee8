"""Based: Taylor linear attention and a small sliding-window softmax.

Arora, Eyuboglu, Zhang, Timalsina, Alberti, Zinsley, Zou, Rudra, Re,
"Simple linear attention language models balance the recall-throughput
tradeoff" (arXiv 2402.18668), section 4. Two sequence mixers:

Linear attention (per head h of the builder's H, feature dim F, value dim
D = E / H):
  q_t = W_q x_t, k_t = W_k x_t [F],  v_t = W_v x_t [D]    (no biases)
  phi(u) = [1, u', (u' outer u') / sqrt(2)],  u' = u / F^(1/4)
  so phi(q) . phi(k) = 1 + s + s^2 / 2,  s = q . k / sqrt(F)
  (the 2nd-order Taylor series of exp(s), always >= 1/2);
  y_t = phi(q_t) S_t / (phi(q_t) . z_t),  S_t = sum_j phi(k_j) v_j^T,
  z_t = sum_j phi(k_j) over the visible real tokens j (causal: j <= t;
  else all), then out = W_o [y_1 .. y_H] (no bias).
The features are stored without the outer product's repeats, as the
authors' forward_mem_save: [1, u', u'_i^2 / sqrt(2) (i), u'_i u'_j (i < j)],
1 + F + F (F + 1) / 2 numbers with the same inner products (153 for F = 16,
not 273). The sums are the project's kernel attention (models/attention/
kernel_attention.py): causal by prefix sums over chunks of chunk_size
positions (a C x C masked product inside a chunk, the carried [H, 153, D]
state across chunks, each chunk rematerialised), non-causal by one global
sum; no [L, L] array (its feature maps need only a positive normaliser,
which 1 + s + s^2 / 2 >= 1/2 per visible key gives).

Sliding-window attention (per head, head dim D = E / H): exact softmax
attention of each query over the keys at most window - 1 positions before it
(causal: t - window < j <= t; non-causal: |t - j| < window), real keys only,
  [q, k, v] = W_qkv x + b,  out = W_o attention(q, k, v) + b,
scores q . k / sqrt(D), in blocks of `window` queries that each read their
own and the previous block (and the next one, non-causal): O(L window)
memory, no [L, L] array. Attention dropout (dropout_rate) on its weights.

How the two mix (option mix): the Based paper's MQAR configuration holds one
mixer per layer, cycling by layer index (HazyResearch/zoology, zoology/
experiments/paper_configs/arxiv24_based_ablations/02-01_sliding.py,
'based_w_slide': zoology.mixers.hybrid.Hybrid over [BaseConv, Based,
SlidingAttn], layer_idx % 3), as do the authors' language models
(HazyResearch/based, train/configs/experiment/reference/based-1b.yaml:
LinearAttention and SlidingAttention in separate layers, alt_mixer_layers
and alt_mixer_2_layers). So mix='alternate' (default): layers 0, 2, 4, ...
run the linear attention, layers 1, 3, ... the sliding window (the gated
BaseConv layer is not part of this mixer; model.short_conv, a short conv
before every mixer, is the harness's nearest). Also 'sum' (both in every
layer, their outputs summed: not the authors'), 'linear' (the linear
attention alone: the Figure 2 MQAR 'based', Hybrid [BaseConv, Based]) and
'sliding' (the window alone: zoology's 'slide' baseline).

Cost per example, G = 1 + F + F (F + 1) / 2 features: linear part
O(L H G (D + C)) time, O(L H G + (L / C) H G D + L C H) memory (features,
one state per chunk, one chunk's C x C products); window part O(L window E)
time and memory. State per example (recurrent inference, as zoology's
state_size): linear H (D + 1) G; window 2 (window - 1) E (the previous
window - 1 keys and values). Features, prefix sums, normaliser,
logits and softmax in float32 whatever the compute dtype; the projections
in the compute dtype.

Padding: the builder zeroes padded inputs; the linear part drops padded
keys (their features and values are zeroed before any sum), the window's
softmax masks them, and the output is multiplied by the real mask. A query
with no visible key (only in an all-padded example) gets zeros.

Initialisation as the authors' models (zoology/model.py _init_weights for a
TransformerBlock; based/models/gpt.py _init_weights): every linear weight
N(0, 0.02^2), biases zero.

Deliberate differences from the authors' code (HazyResearch/based
based/models/mixers/linear_attention.py and slide_attention.py;
HazyResearch/zoology zoology/mixers/based.py, feature_maps/taylor.py and
slide_attn.py):
  - The normaliser: the authors add eps = 1e-12 to phi(q) . z; here num /
    den with den >= 1/2 per visible key (zero output with no visible key),
    the project's kernel attention, a relative change below 1e-12.
  - The window counts keys: window w sees w keys, t - w < j <= t. Zoology's
    SlidingAttn(block_size=b) sees b + 1 (t - b .. t); the based repo's
    flash window_size=(w // 2, 0) sees w // 2 + 1. Non-causal windows are
    not in the authors' code (their window attention is always causal).
  - The sliding window has the builder's heads (the based repo's
    SlidingAttention; zoology's SlidingAttn is one head over E); its
    projections have biases (zoology's SlidingAttn and the based repo's
    default; its 1b config turns them off).
  - No rotary positions inside (the harness's mixers order tokens
    themselves: absolute positions at the embedding apply); no residual
    rescaling of the output projections by the depth (the block's
    business); num_key_value_heads = num_heads.

Shape names: H heads, F feature dim, G expanded features, D value/head dim,
Q blocks, W block length, K keys per block.
"""

from flax import nnx
import jax.numpy as jnp
import numpy as np

from models.attention.base import (
  attend,
  int_option,
  pad_to_multiple,
)
from models.attention.kernel_attention import kernel_attention
from models.attention.registry import register
from models.errors import UserError
from models.mixers.base import (
  SequenceMixer,
  choice_option,
  real_BxL,
  zero_padded,
)

_F32 = jnp.float32
# The authors' init of every linear weight (GPT-2's std).
INIT_STD = 0.02
MIXES = ('alternate', 'sum', 'linear', 'sliding')


def taylor_features(u_XxF):
  """phi(u) without the outer product's repeats, float32 [..., G],
  G = 1 + F + F (F + 1) / 2: [1, u', u'_i^2 / sqrt(2), u'_i u'_j (i < j)],
  u' = u / F^(1/4); phi(q) . phi(k) = 1 + s + s^2 / 2, s = q . k / sqrt(F)."""
  f = u_XxF.shape[-1]
  u_XxF = u_XxF.astype(_F32) * f**-0.25
  i, j = np.triu_indices(f)
  w = np.where(i == j, 2**-0.5, 1.0).astype(np.float32)
  second = u_XxF[..., i] * u_XxF[..., j] * w
  ones = jnp.ones(u_XxF.shape[:-1] + (1,), _F32)
  return jnp.concatenate([ones, u_XxF, second], axis=-1)


def expanded_size(feature_dim):
  """G: the number of Taylor features per head."""
  return 1 + feature_dim + feature_dim * (feature_dim + 1) // 2


def sliding_window_attention(
  q_BxLxHxD, k_BxLxHxD, v_BxLxHxD, real_BxL, window, causal, rate, key
):
  """Softmax attention of query t over the real keys j with t - window < j
  <= t (causal) or |t - j| < window; scores scaled by D^-1/2, float32
  logits and softmax; zeros for a query with no visible key. Blocks of
  W = min(window, L) queries read their block and the previous one (and
  the next, non-causal). Out [B, L, H, D] in v's dtype."""
  b, length, h, d = q_BxLxHxD.shape
  w = min(window, length)

  def blocks(t):  # [B, L, ...] -> [B, Q, W, ...], zero padded.
    t = pad_to_multiple(t, w, axis=1)
    return t.reshape((b, -1, w) + t.shape[2:])

  def neighbours(t):  # [B, Q, W, ...] -> [B, Q, K, ...] (K = 2W or 3W)
    widths = ((0, 0), (1, 1)) + ((0, 0),) * (t.ndim - 2)
    t_pad = jnp.pad(t, widths)  # an empty block each side
    parts = [t_pad[:, :-2], t]  # previous, own
    if not causal:
      parts.append(t_pad[:, 2:])  # next
    return jnp.concatenate(parts, axis=2)

  valid_BxQxK = neighbours(blocks(real_BxL))
  q_BxQxWxHxD = blocks(q_BxLxHxD)
  k_BxQxKxHxD = neighbours(blocks(k_BxLxHxD))
  v_BxQxKxHxD = neighbours(blocks(v_BxLxHxD))
  # Query i of a block, key slot s: the key is i - s + W positions back.
  back_WxK = np.arange(w)[:, None] - np.arange(valid_BxQxK.shape[-1]) + w
  if causal:
    near_WxK = (back_WxK >= 0) & (back_WxK < window)
  else:
    near_WxK = np.abs(back_WxK) < window
  allowed_BxQx1xWxK = valid_BxQxK[:, :, None, None, :] & near_WxK
  heads_first = lambda t: jnp.swapaxes(t, 2, 3)  # noqa: E731
  out_BxQxHxWxD = attend(
    heads_first(q_BxQxWxHxD),
    heads_first(k_BxQxKxHxD),
    heads_first(v_BxQxKxHxD),
    allowed_BxQx1xWxK,
    scale=d**-0.5,
    rate=rate,
    key=key,
  )
  out_BxQxWxHxD = heads_first(out_BxQxHxWxD)
  return out_BxQxWxHxD.reshape(b, -1, h, d)[:, :length]


def _linear(i, o, bias, dtype, rngs):
  return nnx.Linear(
    i,
    o,
    use_bias=bias,
    kernel_init=nnx.initializers.normal(INIT_STD),
    bias_init=nnx.initializers.zeros_init(),
    dtype=dtype,
    rngs=rngs,
  )


class TaylorLinearAttention(nnx.Module):
  """Based's linear attention with the Taylor feature map."""

  def __init__(self, emb_dim, heads, feature_dim, chunk, dtype, rngs):
    self.heads, self.feature_dim, self.chunk = heads, feature_dim, chunk
    self.value_dim = emb_dim // heads
    self.proj_q = _linear(emb_dim, heads * feature_dim, False, dtype, rngs)
    self.proj_k = _linear(emb_dim, heads * feature_dim, False, dtype, rngs)
    self.proj_v = _linear(emb_dim, emb_dim, False, dtype, rngs)
    self.out_proj = _linear(emb_dim, emb_dim, False, dtype, rngs)
    self.dtype = dtype

  def state_size(self):
    return self.heads * (self.value_dim + 1) * expanded_size(self.feature_dim)

  def __call__(self, x_BxLxE, real_BxL, causal, rngs):
    del rngs  # no dropout (the authors' Identity)
    b, length, e = x_BxLxE.shape
    h, f = self.heads, self.feature_dim
    q_BxLxHxF = self.proj_q(x_BxLxE).reshape(b, length, h, f)
    k_BxLxHxF = self.proj_k(x_BxLxE).reshape(b, length, h, f)
    v_BxLxHxD = self.proj_v(x_BxLxE).reshape(b, length, h, self.value_dim)
    y_BxLxHxD = kernel_attention(
      taylor_features(q_BxLxHxF),
      taylor_features(k_BxLxHxF),
      v_BxLxHxD,
      real_BxL,
      causal=causal,
      chunk=self.chunk,
    )
    return self.out_proj(y_BxLxHxD.reshape(b, length, e).astype(self.dtype))


class SlidingWindowAttention(nnx.Module):
  """Exact softmax attention over a small sliding window."""

  def __init__(self, emb_dim, heads, window, dropout_rate, dtype, rngs):
    self.heads, self.window, self.dropout_rate = heads, window, dropout_rate
    self.emb_dim = emb_dim
    self.qkv = _linear(emb_dim, 3 * emb_dim, True, dtype, rngs)
    self.out_proj = _linear(emb_dim, emb_dim, True, dtype, rngs)

  def state_size(self):
    return 2 * (self.window - 1) * self.emb_dim

  def __call__(self, x_BxLxE, real_BxL, causal, rngs):
    b, length, e = x_BxLxE.shape
    shape = (b, length, self.heads, e // self.heads)
    q, k, v = (t.reshape(shape) for t in jnp.split(self.qkv(x_BxLxE), 3, -1))
    out_BxLxHxD = sliding_window_attention(
      q, k, v, real_BxL, self.window, causal, self.dropout_rate, rngs
    )
    return self.out_proj(out_BxLxHxD.reshape(b, length, e))


@register('based')
class Based(SequenceMixer):
  """Based's mixers: Taylor linear attention and/or a sliding window."""

  def __init__(
    self,
    *,
    emb_dim,
    num_heads,
    max_length,
    dropout_rate,
    dtype,
    rngs,
    layer_index=0,
    feature_dim=16,
    window=64,
    mix='alternate',
    chunk_size=64,
  ):
    """Args (own options):
    feature_dim: F, the per-head q, k size before the Taylor map.
    window: keys each query sees in the sliding-window attention (itself
      included, causal); non-causal |t - j| < window.
    mix: 'alternate' (even layers linear attention, odd layers the window),
      'sum' (both in each layer, summed), 'linear' or 'sliding' (one only).
    chunk_size: positions per chunk of the causal linear attention's sums.
    """
    del max_length
    name = 'based'
    feature_dim = int_option(name, 'feature_dim', feature_dim, 1, 16)
    window = int_option(name, 'window', window, 1, 64)
    self.mix = choice_option(name, 'mix', mix, MIXES)
    chunk = int_option(name, 'chunk_size', chunk_size, 1, 64)
    if emb_dim % num_heads:
      raise UserError(
        f'based needs emb_dim divisible by num_heads (D = E / H per head), '
        f'got emb_dim={emb_dim} and num_heads={num_heads}; set e.g. '
        f'--config.model.num_heads=1.'
      )
    even = layer_index % 2 == 0
    use_linear = self.mix in ('sum', 'linear') or (
      self.mix == 'alternate' and even
    )
    use_window = self.mix in ('sum', 'sliding') or (
      self.mix == 'alternate' and not even
    )
    self.linear = (
      TaylorLinearAttention(emb_dim, num_heads, feature_dim, chunk, dtype, rngs)
      if use_linear
      else None
    )
    self.sliding = (
      SlidingWindowAttention(
        emb_dim, num_heads, window, dropout_rate, dtype, rngs
      )
      if use_window
      else None
    )
    self.dtype = dtype

  def parts(self):
    return [p for p in (self.linear, self.sliding) if p is not None]

  def state_size(self):
    """The parts' recurrent states per example (module docstring)."""
    return sum(p.state_size() for p in self.parts())

  def __call__(self, x_BxLxE, mask, *, rngs=None):
    b, length, _ = x_BxLxE.shape
    real = real_BxL(mask, b, length)
    x_in = zero_padded(x_BxLxE, mask).astype(self.dtype)
    out_BxLxE = sum(
      p(x_in, real, mask.causal, rngs).astype(_F32) for p in self.parts()
    )
    out_BxLxE = jnp.where(real[:, :, None], out_BxLxE, 0)
    return out_BxLxE.astype(x_BxLxE.dtype), {}
