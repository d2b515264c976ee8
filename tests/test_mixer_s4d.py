"""s4d: initialisation, the Vandermonde kernel, FFT = direct convolution,
the module = a float64 step-by-step recurrence, padding, causality, bf16."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models.attention.registry import get_core_class
from models.errors import UserError
import models.mixers.s4d  # noqa: F401 (registers s4d)
from models.mixers.s4d import S4D, fft_conv
from tests import ssm_checks as sc

E = 4


def complex_params(m):
  """(A, dt, B, C, D) of the module in float64 / complex128 numpy."""
  a = -np.exp(sc.p64(m.a_log_neg_re_ExN)) + 1j * sc.p64(m.a_im_ExN)
  dt = np.exp(sc.p64(m.log_dt_E))
  b = sc.p64(m.b_re_ExN) + 1j * sc.p64(m.b_im_ExN)
  c = sc.p64(m.c_re_GxExN) + 1j * sc.p64(m.c_im_GxExN)
  return a, dt, b, c, sc.p64(m.d_E)


def recurrence64(m, u, lengths, causal):
  """x_t = dA x_{t-1} + dB u_t, y_t = 2 Re(C x_t) + D u_t, step by step in
  float64 over each example's real tokens; the backward pass (own C) runs
  the same recurrence from the last real token. Zero at padding."""
  a, dt, b, c, d = complex_params(m)
  da = np.exp(dt[:, None] * a)
  db = (da - 1) / a * b

  def step(x, u_t, g):
    x = da * x + db * u_t[:, None]
    return x, 2 * np.real(np.sum(c[g] * x, axis=-1))

  return sc.recurrence64(u, lengths, causal, d, np.zeros_like(da), step)


def test_registered():
  assert get_core_class('s4d') is S4D


def test_s4d_lin_init_exact():
  m = sc.make(S4D, emb_dim=E)  # defaults: state_size 64, init lin
  _, _, b, c, _ = complex_params(m)
  a = np.asarray(m.state_matrix())  # complex64, as the module uses it
  assert a.shape == (E, 32) and a.dtype == np.complex64
  np.testing.assert_array_equal(a.real, np.float32(-0.5))
  np.testing.assert_array_equal(
    a.imag, np.broadcast_to(np.float32(np.pi * np.arange(32)), (E, 32))
  )
  np.testing.assert_array_equal(b, 1.0)
  assert c.shape == (2, E, 32) and 0.5 < np.var(c) < 1.5  # complex normal
  assert m.state_size() == E * 64


def test_s4d_inv_init_formula():
  n_full = 64
  m = sc.make(S4D, emb_dim=E, state_size=n_full, init='inv')
  a = np.asarray(m.state_matrix())
  n = np.arange(n_full // 2)
  expected = n_full / np.pi * (n_full / (2 * n + 1) - 1)
  np.testing.assert_array_equal(a.real, np.float32(-0.5))
  np.testing.assert_allclose(a.imag, np.broadcast_to(expected, a.shape), 1e-7)
  assert a.imag[0, 0] == pytest.approx(64 / np.pi * 63, rel=1e-7)
  assert a.imag[0, -1] == pytest.approx(64 / np.pi / 63, rel=1e-6)
  assert np.all(np.diff(a.imag[0]) < 0)  # S4D-Inv: decreasing, unlike Lin


@pytest.mark.parametrize('dt_min,dt_max', [(0.001, 0.1), (0.02, 0.03)])
def test_step_sizes_in_range(dt_min, dt_max):
  m = sc.make(S4D, emb_dim=256, dt_min=dt_min, dt_max=dt_max)
  dt = np.exp(sc.p64(m.log_dt_E))
  assert dt.min() >= dt_min * (1 - 1e-6) and dt.max() <= dt_max * (1 + 1e-6)
  # log-uniform: spread over the range, not one value
  assert np.log(dt.max() / dt.min()) > 0.8 * np.log(dt_max / dt_min)


@pytest.mark.parametrize('length', [1, 37, 100])
def test_kernel_is_vandermonde_product(length):
  m = sc.make(S4D, emb_dim=E, state_size=8, dt_min=0.01, dt_max=0.5)
  a, dt, b, c, _ = complex_params(m)
  da = np.exp(dt[:, None] * a)
  db = (da - 1) / a * b
  powers = da[..., None] ** np.arange(length)  # [E, N, L]
  ref = 2 * np.real(np.einsum('gen,enl->gel', c * db, powers))
  k = np.asarray(jax.jit(m.kernels, static_argnums=0)(length), np.float64)
  assert k.shape == (2, E, length)
  np.testing.assert_allclose(k, ref, atol=1e-5 * np.abs(ref).max())


@pytest.mark.parametrize('two_way', [False, True])
def test_fft_conv_equals_direct_convolution(two_way):
  length = 37
  rng = np.random.default_rng(0)
  u = rng.normal(size=(2, length, E))
  kf, kb = rng.normal(size=(2, E, length))
  out = jax.jit(fft_conv)(
    jnp.asarray(u, jnp.float32),
    jnp.asarray(kf, jnp.float32),
    jnp.asarray(kb, jnp.float32) if two_way else None,
  )
  ref = np.zeros_like(u)
  for t in range(length):
    for s in range(t + 1):
      ref[:, t] += kf[:, t - s] * u[:, s]
    if two_way:
      for s in range(t, length):
        ref[:, t] += kb[:, s - t] * u[:, s]
  np.testing.assert_allclose(np.asarray(out), ref, atol=1e-4)


@functools.cache
def oracle_mixer(activation):
  # Larger steps than the defaults so that the convolution, not D u,
  # dominates the output (a wrong one cannot hide).
  return sc.make(
    S4D,
    emb_dim=E,
    state_size=8,
    dt_min=0.05,
    dt_max=0.5,
    activation=activation,
  )


# Both lengths in both modes, each activation at least once (a compilation
# per case is the cost).
@pytest.mark.parametrize(
  'length,causal,activation',
  [
    (37, True, 'gelu'),
    (37, False, 'glu'),
    (100, True, 'glu'),
    (100, False, 'gelu'),
  ],
)
def test_module_equals_float64_recurrence(length, causal, activation):
  m = oracle_mixer(activation)
  lengths = (length, 20)
  x = sc.inputs(1, 2, length, E)
  out = sc.run(m, x, sc.padding(lengths, length), causal)
  y = recurrence64(m, x, lengths, causal)
  ref = sc.head64(m, y, lengths)
  np.testing.assert_allclose(out, ref, atol=3e-5 * np.abs(ref).max())
  conv = y[0] - sc.p64(m.d_E) * np.asarray(x[0])
  assert np.abs(conv).max() > 0.3 * np.abs(y[0]).max()


@pytest.mark.parametrize('causal', [True, False])
def test_padding(causal):
  m = sc.make(S4D, emb_dim=E, state_size=8, dt_min=0.05, dt_max=0.5)
  sc.check_padding_invariance(m, 37, E, causal)


def test_finite_gradients():
  # Bidirectional: every parameter is used (the causal path is a subset,
  # its Jacobian is checked finite in test_causality_by_gradient).
  m = sc.make(S4D, emb_dim=E, state_size=8, activation='glu')
  sc.check_finite_gradients(m, 16, E, causal=False)


def test_causality_by_gradient():
  m = sc.make(S4D, emb_dim=E, state_size=8, dt_min=0.05, dt_max=0.5)
  # FFT rounding: the future is zero up to float32 error, not bit-exact.
  sc.check_causality(m, 12, E, exact=False)


def test_bfloat16_under_jit():
  sc.check_bf16_close(
    S4D, 37, E, False, atol=0.05, state_size=8, activation='glu'
  )


def test_dropout_uses_the_key():
  sc.check_dropout_uses_the_key(S4D, E, state_size=8)


@pytest.mark.parametrize(
  'options,words',
  [
    ({'state_size': 7}, 'state_size must be even'),
    ({'state_size': 0}, 'state_size must be an integer >= 2'),
    ({'init': 'legs'}, 'init must be one of lin, inv'),
    ({'dt_min': 0.2, 'dt_max': 0.1}, '0 < dt_min <= dt_max'),
    ({'activation': 'relu'}, 'activation must be one of gelu, glu'),
    ({'bidirectional': 'yes'}, 'bidirectional must be true or false'),
  ],
)
def test_bad_options_are_user_errors(options, words):
  with pytest.raises(UserError, match=words):
    sc.make(S4D, emb_dim=E, **options)
