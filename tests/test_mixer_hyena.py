"""hyena: the implicit filters = a float64 FFN of the authors' features, the
long convolutions = their direct sums, the module = a float64 layer with
direct sums and gates (causal and bidirectional, padded, one and two
filters); initialisation, padding, causality, bf16, dropout, options."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models.attention import Mask
from models.attention.registry import get_core_class
from models.errors import UserError
import models.mixers.hyena  # noqa: F401 (registers 'hyena')
from models.mixers.hyena import Hyena, decay_rates, positional_features
from tests import ssm_checks as sc

E = 8
SMALL = {'filter_order': 16, 'filter_emb_dim': 5}
# Read by tests/test_mixer_suite.py: small, fast options for its runs.
SUITE = dict(opts=dict(SMALL))


@functools.cache
def mixer(long_filters):
  m = sc.make(Hyena, emb_dim=E, long_filters=long_filters, **SMALL)
  # Filters a few times their initial size, so that the long convolutions,
  # not the D skips, carry the output (a wrong sum cannot hide).
  m.ffn_w3_OxC[...] = 4 * m.ffn_w3_OxC[...]
  # Sin frequencies apart from their initial 1 (one per FFN unit, shared by
  # the three activations), so that a missing one shows.
  m.sin_freq_O[...] = jnp.linspace(0.5, 2.0, SMALL['filter_order'])
  return m


def filters64(m, lags):
  """h[i, e, p] at the integer lags p in float64: the FFN with shared Sin
  frequencies on the authors' positional features, times the window."""
  p = lambda name: sc.p64(getattr(m, name))  # noqa: E731
  z = positional_features(lags, m.max_length, m.filter_emb_dim)
  a = np.sin(p('sin_freq_O') * (z @ p('ffn_w0_MxO') + p('ffn_b0_O')))
  a = np.sin(p('sin_freq_O') * (a @ p('ffn_w1_OxO') + p('ffn_b1_O')))
  a = np.sin(p('sin_freq_O') * (a @ p('ffn_w2_OxO') + p('ffn_b2_O')))
  h = a @ p('ffn_w3_OxC')  # [P, E F], channel e F + i
  t = np.abs(np.asarray(lags)) / (m.max_length - 1)
  f = m.long_filters
  deltas = np.linspace(math.log(1e-2) / 1.5, math.log(1e-2) / 0.3, E * f)
  h = h * np.exp(-t[:, None] * np.abs(deltas)[None])
  return h.reshape(len(t), E, f).transpose(2, 1, 0)


def direct_conv64(h, u, d, n, causal):
  """sum_{s<=t} h(t - s) u_s (+ sum_{t<s<n} h(t - s) u_s) + D u_t over the
  first n positions, float64; h(lag) = h[:, lag] (negative lags wrap to
  the end of h, which holds lags -(P-1) .. -1)."""
  y = np.zeros_like(u)
  for t in range(n):
    for s in range(n if not causal else t + 1):
      y[t] += h[:, t - s] * u[s]
    y[t] += d * u[t]
  return y


def layer64(m, x, lengths, causal):
  """The whole mixer in float64 numpy: projection, short causal conv,
  direct long convolutions and gates, output projection; zero at padding."""
  b, length, _ = x.shape
  real = np.arange(length)[None, :] < np.asarray(lengths)[:, None]
  u = np.asarray(x, np.float64) * real[..., None]
  p = (u @ sc.p64(m.in_proj.kernel) + sc.p64(m.in_proj.bias)) * real[..., None]
  w, bias = sc.p64(m.conv_KxS), sc.p64(m.conv_bias_S)
  k = w.shape[0]
  conv = np.tile(bias, (b, length, 1))
  for t in range(length):
    for j in range(k):
      if t - k + 1 + j >= 0:
        conv[:, t] += w[j] * p[:, t - k + 1 + j]
  x1, x2, v = np.split(conv * real[..., None], 3, axis=-1)
  # Lags 0 .. L-1, then -(L-1) .. -1: h(t - s) is h[:, t - s] either way.
  lags = np.concatenate([np.arange(length), np.arange(-length + 1, 0)])
  h, d = filters64(m, lags), sc.p64(m.d_ExF).T
  f = m.long_filters
  y = np.zeros_like(v)
  for i, n in enumerate(lengths):
    z = v[i]
    for step, gate in enumerate((x1[i], x2[i])):
      if step - (2 - f) >= 0:
        j = step - (2 - f)
        z = direct_conv64(h[j], z, d[j], n, causal)
      z = gate * z
    y[i] = z
  out = y @ sc.p64(m.out_proj.kernel) + sc.p64(m.out_proj.bias)
  return out * real[..., None]


def test_registered():
  assert get_core_class('hyena') is Hyena


def test_positional_features_are_the_authors():
  # torch.linspace(0, 1, M); w = 2 pi linspace(0, M-1, M) / M; bands f =
  # linspace(1e-4, K-1, K); z = exp(-i f w) as (real, imag) columns.
  m_len, emb = 10, 7
  z = positional_features(np.arange(m_len), m_len, emb)
  w = 2 * np.pi * np.arange(m_len) / m_len
  f = np.array([1e-4, (1e-4 + 2) / 2, 2.0])  # K = 3 bands
  np.testing.assert_allclose(z[:, 0], np.linspace(0, 1, m_len))
  np.testing.assert_allclose(z[:, 1:4], np.cos(np.outer(w, f)))
  np.testing.assert_allclose(z[:, 4:], -np.sin(np.outer(w, f)))
  # Negative lags: t and w odd.
  neg = positional_features(-np.arange(m_len), m_len, emb)
  np.testing.assert_allclose(neg, z * np.array([-1, 1, 1, 1, -1, -1, -1]))


def test_initialisation_as_the_authors():
  m = sc.make(Hyena, emb_dim=32)  # defaults: order 64, emb 33, 2 filters
  assert m.ffn_w0_MxO.shape == (33, 64) and m.ffn_w3_OxC.shape == (64, 64)
  np.testing.assert_array_equal(sc.p64(m.sin_freq_O), 1.0)  # w = 1
  for name, fan_in in [
    ('ffn_w0_MxO', 33),
    ('ffn_b0_O', 33),
    ('ffn_w2_OxO', 64),
    ('ffn_w3_OxC', 64),
    ('conv_KxS', 3),
    ('conv_bias_S', 3),
  ]:  # PyTorch's Linear / depthwise Conv1d defaults: U(+-fan_in^-1/2)
    top = np.abs(sc.p64(getattr(m, name))).max()
    assert 0.8 * fan_in**-0.5 < top <= fan_in**-0.5, name
  for lin in (m.in_proj, m.out_proj):
    for p in (lin.kernel, lin.bias):
      assert 0.9 * 32**-0.5 < np.abs(sc.p64(p)).max() <= 32**-0.5
  assert m.d_ExF.shape == (32, 2) and 0.7 < np.std(sc.p64(m.d_ExF)) < 1.3
  assert m.state_size() is None


@pytest.mark.parametrize('two_way', [False, True])
def test_filters_are_the_float64_ffn_times_the_window(two_way):
  m, length = mixer(2), 37
  got = np.asarray(jax.jit(m.filters, static_argnums=(0, 1))(length, two_way))
  lags = np.arange(length)
  if two_way:
    lags = np.concatenate([lags, -lags[1:]])
  ref = filters64(m, lags)
  np.testing.assert_allclose(got, ref, atol=2e-6 * np.abs(ref).max())


def test_decay_rates_are_the_authors():
  # ExponentialModulation: the slowest channel's window reaches 1e-2 at
  # t = 1.5 (slow_decay_pct), the fastest at t = 0.3 (fast_decay_pct).
  r = np.abs(decay_rates(16))
  np.testing.assert_allclose(np.exp(-r[0] * 1.5), 1e-2)  # slow
  np.testing.assert_allclose(np.exp(-r[-1] * 0.3), 1e-2)  # fast
  np.testing.assert_allclose(np.diff(r), np.diff(r)[0])  # linear spread


@pytest.mark.parametrize('causal', [True, False])
def test_long_conv_is_the_direct_sum(causal):
  m, length = mixer(2), 37
  rng = np.random.default_rng(0)
  u = rng.standard_normal((2, length, E))
  p = length if causal else 2 * length - 1
  h, d = rng.standard_normal((E, p)), rng.standard_normal(E)
  f32 = lambda a: jnp.asarray(a, jnp.float32)  # noqa: E731
  conv = jax.jit(m.long_conv, static_argnums=3)
  got = np.asarray(conv(f32(u), f32(h), f32(d), not causal))
  # Lags 0 .. L-1 then -1 .. -(L-1) (filter_lags) as direct_conv64 reads
  # them: -(L-1) .. -1 at the end.
  h_read = np.concatenate([h[:, :length], h[:, length:][:, ::-1]], axis=1)
  for b in range(2):
    ref = direct_conv64(h_read, u[b], d, length, causal)
    np.testing.assert_allclose(got[b], ref, atol=2e-5 * np.abs(ref).max())


# Both filter counts, both modes, two lengths; padded with noise there.
@pytest.mark.parametrize(
  'length,causal,long_filters',
  [(37, True, 2), (37, False, 2), (16, True, 1), (16, False, 1)],
)
def test_module_equals_float64_reference(length, causal, long_filters):
  m = mixer(long_filters)
  lengths = (length, length // 2 + 1)
  pad = sc.padding(lengths, length)
  x = sc.inputs(3, 2, length, E)
  noisy = jnp.where(pad[:, :, None], x, sc.inputs(4, 2, length, E, 10.0))
  out = sc.run(m, noisy, pad, causal)
  ref = layer64(m, x, lengths, causal)
  np.testing.assert_allclose(out, ref, atol=1e-5 * np.abs(ref).max())
  assert np.all(out[1, lengths[1] :] == 0)


def test_filters_matter():
  """The long convolutions carry the output: without their filters (D
  skips alone) the float64 layer differs by a large fraction."""
  m, length = mixer(2), 37
  x = sc.inputs(3, 2, length, E)
  full = layer64(m, x, (length, length), True)
  saved = m.ffn_w3_OxC[...]
  m.ffn_w3_OxC[...] = 0 * saved
  try:
    skips = layer64(m, x, (length, length), True)
  finally:
    m.ffn_w3_OxC[...] = saved
  assert np.abs(full - skips).max() > 0.3 * np.abs(full).max()


def test_padding():
  # Bidirectional, where padding could leak backwards; the causal form is
  # checked padded against the float64 layer above.
  sc.check_padding_invariance(mixer(2), 37, E, False)


def test_causality_by_gradient():
  sc.check_causality(mixer(2), 12, E, exact=False)


def test_finite_gradients():
  sc.check_finite_gradients(mixer(2), 16, E, causal=False)


def test_bfloat16_under_jit():
  sc.check_bf16_close(Hyena, 37, E, False, atol=0.05, **SMALL)


def test_dropout_uses_the_key():
  sc.check_dropout_uses_the_key(Hyena, E, **SMALL)


def test_longer_than_max_length_is_refused():
  m = mixer(2)  # max_length 128
  with pytest.raises(UserError, match='raise --config.max_length'):
    m(jnp.zeros((1, 129, E)), Mask(None, True))


@pytest.mark.parametrize(
  'options,words',
  [
    ({'filter_emb_dim': 4}, 'filter_emb_dim must be odd'),
    ({'filter_emb_dim': 1}, 'filter_emb_dim must be an integer >= 3'),
    ({'filter_order': 0}, 'filter_order must be an integer >= 1'),
    ({'filter_freq': 0.0}, 'filter_freq must be a positive number'),
    ({'long_filters': 3}, 'long_filters must be 1 or 2'),
    ({'short_width': 0}, 'short_width must be an integer >= 1'),
    ({'bidirectional': 1}, 'bidirectional must be true or false'),
  ],
)
def test_bad_options_are_user_errors(options, words):
  with pytest.raises(UserError, match=words):
    sc.make(Hyena, emb_dim=E, **options)
