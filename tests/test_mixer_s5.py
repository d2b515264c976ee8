"""s5: the HiPPO-N initialisation, the associative scan, the module = a
float64 step-by-step recurrence, padding, causality, bf16."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models.attention.registry import get_core_class
from models.errors import UserError
import models.mixers.s5  # noqa: F401 (registers s5)
from models.mixers.s5 import S5, block_hippo_n, hippo_n, linear_scan
from tests import ssm_checks as sc

E, P = 4, 8


def hippo_n_direct(size):
  """HiPPO-LegS + p p^T written entry by entry (float64)."""
  a = np.zeros((size, size))
  for n in range(size):
    for k in range(size):
      if n > k:
        a[n, k] = -np.sqrt((2 * n + 1) * (2 * k + 1))
      elif n == k:
        a[n, k] = -(n + 1)
      a[n, k] += np.sqrt((n + 0.5) * (k + 0.5))
  return a


def sorted_spectrum(z):
  return np.sort_complex(np.round(np.asarray(z, np.complex128), 9))


def complex_params(m):
  """(Lambda, dt, B~, C~, D) of the module in float64 / complex128."""
  lam = -np.exp(sc.p64(m.lambda_log_neg_re_N)) + 1j * sc.p64(m.lambda_im_N)
  dt = np.exp(sc.p64(m.log_step_N))
  b = sc.p64(m.b_re_NxE) + 1j * sc.p64(m.b_im_NxE)
  c = sc.p64(m.c_re_GxExN) + 1j * sc.p64(m.c_im_GxExN)
  return lam, dt, b, c, sc.p64(m.d_E)


def recurrence64(m, u, lengths, causal):
  """x_t = Abar x_{t-1} + Bbar u_t, y_t = 2 Re(C~ x_t) + D u_t step by step
  in float64 over each example's real tokens; bidirectional: the same
  Abar, Bbar from the last real token backwards, read by the second C~."""
  lam, dt, b, c, d = complex_params(m)
  abar = np.exp(lam * dt)
  bbar = ((abar - 1) / lam)[:, None] * b

  def step(x, u_t, g):
    x = abar * x + bbar @ u_t
    return x, 2 * np.real(c[g] @ x)

  return sc.recurrence64(u, lengths, causal, d, np.zeros_like(abar), step)


def test_registered():
  assert get_core_class('s5') is S5


@pytest.mark.parametrize('size', [2, 8, 64])
def test_hippo_n_eigenvalues_match_the_direct_matrix(size):
  lam, v = hippo_n(size)
  full = np.concatenate([lam, lam.conj()])  # conjugate symmetry
  direct = np.linalg.eigvals(hippo_n_direct(size))
  np.testing.assert_allclose(
    sorted_spectrum(full), sorted_spectrum(direct), atol=1e-8
  )
  assert np.all(lam.imag > 0) and np.allclose(lam.real, -0.5)
  a_n = hippo_n_direct(size)
  np.testing.assert_allclose(a_n @ v, v * lam, atol=1e-9 * size**2)
  np.testing.assert_allclose(v.conj().T @ v, np.eye(size // 2), atol=1e-12)


def test_module_init_is_hippo_n_in_its_eigenbasis():
  m = sc.make(S5, emb_dim=E)  # defaults: state_size 64, blocks 1
  lam64, v = hippo_n(64)
  lam = np.asarray(m.state_matrix())  # complex64, as the module uses it
  assert lam.shape == (32,) and lam.dtype == np.complex64
  np.testing.assert_array_equal(lam.real, np.float32(-0.5))
  np.testing.assert_array_equal(lam.imag, lam64.imag.astype(np.float32))
  _, _, b, c, _ = complex_params(m)
  assert b.shape == (32, E) and c.shape == (2, E, 32)
  # B~ = V^H B with B real: V B~ + conj(V B~) = B, and B has variance 1/E.
  b_real = 2 * np.real(v @ b)
  np.testing.assert_allclose(v.conj().T @ b_real, b, atol=1e-6)
  assert 0.5 / E < np.var(b_real) < 1.5 / E
  # C~ = C V with C complex normal of unit variance (V has unit columns).
  assert 0.5 < np.mean(np.abs(c) ** 2) < 1.5
  assert m.state_size() == 64


def test_blocks_repeat_hippo_n_on_a_block_diagonal():
  lam, v = block_hippo_n(16, 2)
  lam8, v8 = hippo_n(8)
  np.testing.assert_array_equal(lam, np.tile(lam8, 2))
  np.testing.assert_array_equal(v[:8, :4], v8)
  np.testing.assert_array_equal(v[8:, 4:], v8)
  assert not v[:8, 4:].any() and not v[8:, :4].any()
  m = sc.make(S5, emb_dim=E, state_size=16, blocks=2)
  np.testing.assert_allclose(np.asarray(m.state_matrix()), lam, rtol=1e-6)


@pytest.mark.parametrize('dt_min,dt_max', [(0.001, 0.1), (0.02, 0.03)])
def test_step_sizes_in_range(dt_min, dt_max):
  m = sc.make(S5, emb_dim=E, state_size=128, dt_min=dt_min, dt_max=dt_max)
  dt = np.exp(sc.p64(m.log_step_N))
  assert dt.shape == (64,)  # one step per kept state
  assert dt.min() >= dt_min * (1 - 1e-6) and dt.max() <= dt_max * (1 + 1e-6)
  assert np.log(dt.max() / dt.min()) > 0.8 * np.log(dt_max / dt_min)


@pytest.mark.parametrize('reverse', [False, True])
def test_associative_scan_equals_loop(reverse):
  rng = np.random.default_rng(0)
  length, n = 37, 3
  a = np.exp(-rng.uniform(0.01, 0.5, n) + 1j * rng.normal(size=n))
  b = rng.normal(size=(2, length, n)) + 1j * rng.normal(size=(2, length, n))
  out = jax.jit(linear_scan, static_argnums=2)(
    jnp.asarray(a, jnp.complex64), jnp.asarray(b, jnp.complex64), reverse
  )
  ref = np.zeros_like(b)
  x = np.zeros((2, n), complex)
  for t in reversed(range(length)) if reverse else range(length):
    x = a * x + b[:, t]
    ref[:, t] = x
  np.testing.assert_allclose(np.asarray(out), ref, atol=1e-5)


@functools.cache
def oracle_mixer(activation):
  # Larger steps than the defaults so that the state, not D u,
  # dominates the output (a wrong one cannot hide).
  return sc.make(
    S5,
    emb_dim=E,
    state_size=P,
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
  ssm = y[0] - sc.p64(m.d_E) * np.asarray(x[0])
  assert np.abs(ssm).max() > 0.3 * np.abs(y[0]).max()


@pytest.mark.parametrize('causal', [True, False])
def test_padding(causal):
  m = sc.make(S5, emb_dim=E, state_size=P, dt_min=0.05, dt_max=0.5)
  sc.check_padding_invariance(m, 37, E, causal)


def test_finite_gradients():
  # Bidirectional: every parameter is used (the causal path is a subset,
  # its Jacobian is checked finite in test_causality_by_gradient).
  m = sc.make(S5, emb_dim=E, state_size=P, activation='glu')
  sc.check_finite_gradients(m, 16, E, causal=False)


def test_causality_by_gradient():
  m = sc.make(S5, emb_dim=E, state_size=P, dt_min=0.05, dt_max=0.5)
  sc.check_causality(m, 12, E, exact=True)  # the scan never looks ahead


def test_bfloat16_under_jit():
  sc.check_bf16_close(
    S5, 37, E, False, atol=0.05, state_size=P, activation='glu'
  )


def test_dropout_uses_the_key():
  sc.check_dropout_uses_the_key(S5, E, state_size=P)


@pytest.mark.parametrize(
  'options,words',
  [
    ({'state_size': 6, 'blocks': 2}, 'multiple of 2 \\* blocks'),
    ({'state_size': 7}, 'multiple of 2 \\* blocks'),
    ({'blocks': 0}, 'blocks must be an integer >= 1'),
    ({'dt_min': 0.0}, '0 < dt_min <= dt_max'),
    ({'activation': 'half_glu'}, 'activation must be one of gelu, glu'),
    ({'bidirectional': 1}, 'bidirectional must be true or false'),
  ],
)
def test_bad_options_are_user_errors(options, words):
  with pytest.raises(UserError, match=words):
    sc.make(S5, emb_dim=E, **options)


def test_gelu_is_the_authors_tanh_form_by_default():
  """The S5 authors' flax nn.gelu is the tanh approximation (S4D's PyTorch
  nn.GELU the exact form): the default head follows it, and the exact form
  is an option that changes the output."""
  from models.mixers.s4d import S4D  # pylint: disable=g-import-not-at-top

  assert sc.make(S5, emb_dim=4, state_size=4).gelu_approximate is True
  assert sc.make(S4D, emb_dim=4, state_size=4).gelu_approximate is False
  x = sc.inputs(0, 2, 12, 4, scale=3.0)
  tanh = sc.run(sc.make(S5, emb_dim=4, state_size=4), x)
  exact = sc.run(
    sc.make(S5, emb_dim=4, state_size=4, gelu_approximate=False), x
  )
  assert 1e-6 < np.max(np.abs(tanh - exact)) < 1e-1
