"""Hyena: implicit long convolutions interleaved with data-controlled gates.

Poli, Massaroli, Nguyen, Fu, Dao, Baccus, Bengio, Ermon, Re, "Hyena
Hierarchy: Towards Larger Convolutional Language Models" (arXiv
2302.10866), Definition 3.1 and Algorithms 1-3, order 2:
  (x1, x2, v) = ShortConv_3(Linear_E->3E(u))     depthwise causal, width 3
  z = x1 (.) (h1 * v + D1 v)                       long_filters = 2
  y = x2 (.) (h2 * z + D2 z),   out = Linear_E->E(y)
i.e. Definition 3.1's z^1 = v, z^(n+1) = x^n (.) (h^n * z^n), y = z^3, each
long convolution with its bias term D (the authors' filter bias, a skip).
long_filters = 1 is the authors' released order-2 operator (safari
HyenaOperator(order=2), zoology Hyena): the same three streams and one
filter, y = x2 (.) (h * z + D z) with z = x1 (.) v.
The filters are implicit: per channel e and filter i,
  h_i[e](t) = FFN(PE(t))[e, i] * (exp(-|t| |delta_(e,i)|) + shift)
  PE(t) = (t, cos(f_1 w), .., cos(f_K w), -sin(f_1 w), .., -sin(f_K w))
with t = l / (M - 1) and w = 2 pi l / M at lag l, M = max_length (the
authors' l_max), K = (filter_emb_dim - 1) / 2 bands f_k = linspace(1e-4,
K - 1, K) (the real and imaginary parts of exp(-i f w)); the FFN is
Linear_emb->O, Sin, Linear_O->O, Sin, Linear_O->O, Sin, Linear_O->(F E) (no
bias) with O = filter_order and Sin(x) = sin(a (.) x), one learned
frequency vector a (init filter_freq) shared by the three activations; the
decay rates spread linearly over the F E filter channels from log(target)
/ slow_decay_pct to log(target) / fast_decay_pct (target 1e-2, 1.5, 0.3,
shift 0: the authors' ExponentialModulation). A filter channel's index is
e F + i (the authors' '(v o)' layout), for its FFN column, decay and D.
Each long convolution is s4d's `fft_conv` (models/mixers/s4d.py): one real
FFT of length 2L, so nothing wraps around.

Non-causal (mask.causal False, bidirectional True): the filters are defined
on negative lags too, by the same FFN at t < 0 (PE(-l): t -> -t, w -> -w)
and the window exp(-|t| |delta|):
  (h * u)_t = sum_{s<=t} h(t - s) u_s + sum_{s>t} h(t - s) u_s
with h(0) read once. The short convolution stays causal (as zoology's
bidirectional Hyena).

Initialisation as the authors' code (HazyResearch/safari src/models/
sequence/hyena.py: HyenaOperator, HyenaFilter, PositionalEmbedding,
ExponentialModulation, Sin; HazyResearch/zoology zoology/mixers/hyena.py:
Hyena, Filter): every Linear PyTorch's default (kernel and bias
U(+-fan_in^-1/2)), the short conv's PyTorch default for a depthwise Conv1d
(U(+-3^-1/2) for kernel and bias), the Sin frequencies filter_freq (their
w = 1), D standard normal; streams split as zoology's (x1, x2, v) channel
blocks. Defaults filter_order 64 (their HyenaOperator), filter_emb_dim 33
(their Pile and evaluation configs; the filter default is 3).

Cost: the filters O(P (emb O + 2 O^2 + O F E)) with P = L lags (2L - 1
bidirectional), once per call; the convolutions O(B E L log L) time and
O(B E L) memory each, F of them; no [L, L] array. state_size() is None:
the filters are as long as the input (implicit, not a finite-state system;
the authors' recurrent inference needs them distilled into an SSM first),
so exact recurrent inference keeps all L past inputs (Zoology's hyena
reports E L).

Exact limit / reference: tests/test_mixer_hyena.py computes the filters,
the short convolution, every long convolution as the direct sum
sum_{s<=t} h(t - s) u_s (both signs of t - s when bidirectional) and the
gates in float64 numpy, and the module equals it to float32 rounding,
causal and bidirectional, with padding. Filters, convolutions, gates and
sums are float32 whatever the compute dtype; the projections run in
`dtype`.

Padding: the three streams are zeroed at padded positions (after the
projection's and the short conv's biases), so a padded position adds
nothing to any convolution and every gated stream is zero there: padded
content reaches no output, and left-packed examples ([a b c _ _]) give the
real outputs of the unpadded example (the filters depend on the lag and
max_length, not on L). The output is zeroed at padded positions: an
all-padded example gives zeros. Inputs longer than max_length are refused
(the filters are defined for lags below it, as the authors' l_max).

Options (`model.attention.<option>`): filter_order (O, 64), filter_emb_dim
(odd, >= 3, default 33), filter_freq (the Sin frequency w, 1.0),
long_filters (2: Definition 3.1's order 2; 1: the authors' code),
short_width (3), bidirectional (default True: used when the mask is not
causal; a causal mask convolves with the causal halves alone).

Deliberate differences from the authors' code:
  - The positional features are a fixed function of the lag (the authors'
    PositionalEmbedding is a parameter learned at lr 1e-5, initialised to
    the same values); the decay rates are fixed as theirs (modulation_lr
    0). The filter FFN's lr 1e-3 and no weight decay are not applied (the
    harness's optimiser treats every parameter alike).
  - long_filters = 2 (default) follows the paper's Definition 3.1; the
    released code's order 2 has one filter (long_filters = 1).
  - Dropout (the model's rate) after the first gate, as the authors'; no
    filter dropout (theirs is 0 and unimplemented).
  - The bidirectional form (negative lags of the same implicit filter) is
    this module's; zoology's calls a separate reverse filter.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np

from models.attention.base import bool_option, int_option
from models.attention.registry import register
from models.errors import UserError
from models.mixers.base import (
  SequenceMixer,
  causal_conv,
  dropout,
  f32_param,
  numpy_rng,
  real_BxL,
  zero_padded,
)
from models.mixers.h3 import torch_linear
from models.mixers.s4d import fft_conv

# Local legend: F long filters, O the filter FFN's width, M the positional
# features (filter_emb_dim), P lags, K short conv width, S = 3 E streams.
_F32 = jnp.float32
_HIGHEST = jax.lax.Precision.HIGHEST
# The authors' ExponentialModulation defaults.
FAST_DECAY_PCT, SLOW_DECAY_PCT, TARGET, SHIFT = 0.3, 1.5, 1e-2, 0.0


def positional_features(lags, max_length, emb_dim):
  """float64 [P, M]: (t, cos(f w), -sin(f w)) at the integer `lags`, with
  t = lag / (max_length - 1), w = 2 pi lag / max_length (the authors'
  PositionalEmbedding over seq_len = max_length, extended to negative
  lags as an odd t and w) and f = linspace(1e-4, K - 1, K), K bands."""
  lags = np.asarray(lags, np.float64)
  bands = (emb_dim - 1) // 2
  t_P = lags / max(max_length - 1, 1)
  w_P = 2 * np.pi * lags / max_length
  fw_PxK = np.linspace(1e-4, bands - 1, bands)[None, :] * w_P[:, None]
  return np.concatenate([t_P[:, None], np.cos(fw_PxK), -np.sin(fw_PxK)], 1)


def decay_rates(channels):
  """float64 [channels]: the authors' ExponentialModulation deltas (their
  absolute values are the decay rates per unit of t)."""
  max_decay = math.log(TARGET) / FAST_DECAY_PCT
  min_decay = math.log(TARGET) / SLOW_DECAY_PCT
  return np.linspace(min_decay, max_decay, channels)


def filter_lags(length, two_way):
  """The lags the filters are evaluated at: 0 .. L-1, then -1 .. -(L-1)
  when two_way."""
  lags = np.arange(length)
  return np.concatenate([lags, -lags[1:]]) if two_way else lags


def real_number(value):
  return isinstance(value, (int, float, np.floating)) and not isinstance(
    value, bool
  )


@register('hyena')
class Hyena(SequenceMixer):
  """Hyena order-2 sequence mixer (see the module docstring)."""

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
    filter_order=64,
    filter_emb_dim=33,
    filter_freq=1.0,
    long_filters=2,
    short_width=3,
    bidirectional=True,
  ):
    del num_heads, layer_index
    name = 'hyena'
    order = int_option(name, 'filter_order', filter_order, 1, 64)
    m = int_option(name, 'filter_emb_dim', filter_emb_dim, 3, 33)
    if m % 2 == 0:
      raise UserError(
        f'hyena filter_emb_dim must be odd (t and the cos, sin pairs), got '
        f'{m}; set e.g. --config.model.attention.filter_emb_dim=33.'
      )
    if not (real_number(filter_freq) and 0 < filter_freq < math.inf):
      raise UserError(
        f'hyena filter_freq must be a positive number, got {filter_freq!r}; '
        'set e.g. --config.model.attention.filter_freq=1.0.'
      )
    f = int_option(name, 'long_filters', long_filters, 1, 2)
    if f > 2:
      raise UserError(
        f'hyena long_filters must be 1 or 2 (order 2), got {f}; set e.g. '
        '--config.model.attention.long_filters=2.'
      )
    width = int_option(name, 'short_width', short_width, 1, 3)
    self.bidirectional = bool_option(name, 'bidirectional', bidirectional)
    self.filter_emb_dim, self.filter_order, self.long_filters = m, order, f
    self.emb_dim = e = emb_dim
    self.max_length = max_length
    self.dtype = dtype
    self.dropout_rate = dropout_rate
    rng = numpy_rng(rngs)

    def uniform(fan_in, shape):
      bound = fan_in**-0.5
      return f32_param(rng.uniform(-bound, bound, shape))

    self.in_proj = torch_linear(e, 3 * e, dtype, rngs)
    self.conv_KxS = uniform(width, (width, 3 * e))
    self.conv_bias_S = uniform(width, (3 * e,))
    self.ffn_w0_MxO = uniform(m, (m, order))
    self.ffn_b0_O = uniform(m, (order,))
    self.ffn_w1_OxO = uniform(order, (order, order))
    self.ffn_b1_O = uniform(order, (order,))
    self.ffn_w2_OxO = uniform(order, (order, order))
    self.ffn_b2_O = uniform(order, (order,))
    self.ffn_w3_OxC = uniform(order, (order, e * f))
    self.sin_freq_O = f32_param(np.full((order,), float(filter_freq)))
    self.d_ExF = f32_param(rng.standard_normal((e, f)))
    self.out_proj = torch_linear(e, e, dtype, rngs)

  def state_size(self):
    """None: the long filters span the whole input (no finite state)."""
    return None

  def filters(self, length, two_way):
    """float32 [F, E, P]: h_i[e] at filter_lags(length, two_way)."""
    lags = filter_lags(length, two_way)
    z_PxM = jnp.asarray(
      positional_features(lags, self.max_length, self.filter_emb_dim), _F32
    )

    def dense(a, w, b=None):
      y = jnp.dot(a, w[...], precision=_HIGHEST)
      return y if b is None else y + b[...]

    def sin(a):
      return jnp.sin(self.sin_freq_O[...] * a)

    a = sin(dense(z_PxM, self.ffn_w0_MxO, self.ffn_b0_O))
    a = sin(dense(a, self.ffn_w1_OxO, self.ffn_b1_O))
    a = sin(dense(a, self.ffn_w2_OxO, self.ffn_b2_O))
    h_PxC = dense(a, self.ffn_w3_OxC)
    t_P = np.abs(lags) / max(self.max_length - 1, 1)
    rates_C = np.abs(decay_rates(self.emb_dim * self.long_filters))
    window_PxC = np.exp(-t_P[:, None] * rates_C[None, :]) + SHIFT
    h_PxC = h_PxC * jnp.asarray(window_PxC, _F32)
    e, f = self.emb_dim, self.long_filters
    return jnp.transpose(h_PxC.reshape(-1, e, f), (2, 1, 0))

  def long_conv(self, u_BxLxE, h_ExP, d_E, two_way):
    """sum_s h(t - s) u_s + D u_t (s <= t causal; all s two_way), float32;
    h_ExP at filter_lags(L, two_way)."""
    length = u_BxLxE.shape[1]
    backward = None
    if two_way:  # lag 0 is read by the forward half alone
      backward = jnp.pad(h_ExP[:, length:], ((0, 0), (1, 0)))
    y = fft_conv(u_BxLxE, h_ExP[:, :length], backward)
    return y + d_E * u_BxLxE

  def __call__(self, x_BxLxE, mask, *, rngs=None):
    b, length, _ = x_BxLxE.shape
    if length > self.max_length:
      raise UserError(
        f'hyena filters are defined for lags below max_length '
        f'{self.max_length}, got a length-{length} input; raise '
        '--config.max_length.'
      )
    keep_BxLx1 = real_BxL(mask, b, length)[:, :, None]
    p = self.in_proj(zero_padded(x_BxLxE, mask).astype(self.dtype))
    p = jnp.where(keep_BxLx1, p.astype(_F32), 0.0)
    p = causal_conv(p, self.conv_KxS[...], self.conv_bias_S[...])
    p = jnp.where(keep_BxLx1, p, 0.0)
    x1_BxLxE, x2_BxLxE, z_BxLxE = jnp.split(p, 3, axis=-1)
    two_way = self.bidirectional and not mask.causal
    h_FxExP = self.filters(length, two_way)
    d_FxE = self.d_ExF[...].T
    f = self.long_filters
    # Definition 3.1: a filter then a gate, twice; one filter: gate first.
    for n, gate_BxLxE in enumerate((x1_BxLxE, x2_BxLxE)):
      i = n - (2 - f)
      if i >= 0:
        z_BxLxE = self.long_conv(z_BxLxE, h_FxExP[i], d_FxE[i], two_way)
      z_BxLxE = gate_BxLxE * z_BxLxE
      if n == 0:
        z_BxLxE = dropout(z_BxLxE, self.dropout_rate, rngs)
    out_BxLxE = self.out_proj(z_BxLxE.astype(self.dtype))
    out_BxLxE = jnp.where(keep_BxLx1, out_BxLxE, 0)
    return out_BxLxE.astype(x_BxLxE.dtype), {}
