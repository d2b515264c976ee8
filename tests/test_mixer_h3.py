"""h3: the shift SSM = its shift register, the diagonal SSM = its bilinear
recurrence, the module = a float64 step-by-step layer (causal and
bidirectional, padded), initialisation, padding, causality, bf16, options."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models.attention.registry import get_core_class
from models.errors import UserError
import models.mixers.h3  # noqa: F401 (registers 'h3')
from models.mixers.h3 import H3
from tests import ssm_checks as sc

E = 8
# Read by tests/test_mixer_suite.py: small, fast options for its runs.
SUITE = dict(opts={'state_size': 8, 'head_dim': 2})


@functools.cache
def mixer(head_dim):
  # Larger steps than the defaults so that the diagonal SSM's memory, not
  # its D skip, carries the output (a wrong kernel cannot hide).
  return sc.make(
    H3, emb_dim=E, state_size=8, head_dim=head_dim, dt_min=0.05, dt_max=0.5
  )


def diag64(m):
  """Bilinear (dA, dB, C, D) of the diagonal SSM in complex128 numpy."""
  a = -np.exp(sc.p64(m.a_log_neg_re_HxN)) + 1j * sc.p64(m.a_im_HxN)
  dt = np.exp(sc.p64(m.log_dt_H))[:, None]
  b = sc.p64(m.b_re_HxN) + 1j * sc.p64(m.b_im_HxN)
  c = sc.p64(m.c_re_GxHxN) + 1j * sc.p64(m.c_im_GxHxN)
  da = (1 + dt * a / 2) / (1 - dt * a / 2)
  db = dt * b / (1 - dt * a / 2)
  return da, db, c, sc.p64(m.d_H)


def shift_register64(m, k, lengths):
  """x_t = S x_(t-1) + e_1 k_t (the shift matrix S), y_t = C x_t + D k_t,
  step by step over each example's real tokens; zero at padding."""
  c, d = sc.p64(m.shift_c_ExT), sc.p64(m.shift_d_E)
  k = np.asarray(k, np.float64)
  y = np.zeros_like(k)
  for i, n in enumerate(lengths):
    x = np.zeros_like(c)  # [E, N]: (k_t, k_(t-1), ..., k_(t-N+1))
    for t in range(n):
      x = np.concatenate([k[i, t][:, None], x[:, :-1]], axis=1)
      y[i, t] = np.sum(c * x, axis=1) + d * k[i, t]
  return y


def diag_recurrence64(m, u, lengths, causal):
  """x_t = dA x_(t-1) + dB u_t, y_t = 2 Re(C x_t) + D u_t on [B, L, H, F]
  (F channels per head share its SSM), step by step over each example's
  real tokens; the backward pass (its own C) runs from the last real one."""
  da, db, c, d = diag64(m)
  u = np.asarray(u, np.float64)
  y = d[:, None] * u
  passes = [(0, False)] + ([] if causal else [(1, True)])
  for i, n in enumerate(lengths):
    y[i, n:] = 0
    for g, backward in passes:
      x = np.zeros(u.shape[2:] + da.shape[-1:], complex)  # [H, F, N]
      for t in reversed(range(n)) if backward else range(n):
        x = da[:, None] * x + db[:, None] * u[i, t][..., None]
        y[i, t] += 2 * np.real(np.sum(c[g][:, None] * x, axis=-1))
  return y


def layer64(m, x, lengths, causal):
  """The whole mixer in float64 numpy from its parameters, one token at a
  time: projections, shift register, outer products, the diagonal
  recurrence, Q^T S, output linear; zero at padding."""
  b, length, e = x.shape
  h, d = m.num_ssm_heads, m.head_dim
  real = np.arange(length)[None, :] < np.asarray(lengths)[:, None]
  u = np.asarray(x, np.float64) * real[..., None]
  qkv = u @ sc.p64(m.qkv.kernel) + sc.p64(m.qkv.bias)
  q, k, v = np.split(qkv, 3, axis=-1)
  k = shift_register64(m, k, lengths)
  kv = k.reshape(b, length, h, d, 1) * v.reshape(b, length, h, 1, d)
  s = diag_recurrence64(m, kv.reshape(b, length, h, d * d), lengths, causal)
  s = s.reshape(b, length, h, d, d)
  y = np.einsum('blhi,blhij->blhj', q.reshape(b, length, h, d), s)
  out = y.reshape(b, length, e) @ sc.p64(m.out.kernel) + sc.p64(m.out.bias)
  return out * real[..., None]


def test_registered():
  assert get_core_class('h3') is H3


def test_initialisation_as_the_authors():
  e, n_full, d = 64, 64, 2
  m = sc.make(H3, emb_dim=e, head_dim=d)  # state_size 64 (the paper's)
  h, n = e // d, n_full // 2
  a = -np.exp(sc.p64(m.a_log_neg_re_HxN)) + 1j * sc.p64(m.a_im_HxN)
  np.testing.assert_allclose(a.real, -0.5, rtol=1e-7)
  np.testing.assert_allclose(a.imag, np.pi * np.arange(n)[None].repeat(h, 0))
  np.testing.assert_array_equal(sc.p64(m.b_re_HxN), 1.0)
  np.testing.assert_array_equal(sc.p64(m.b_im_HxN), 0.0)
  c = sc.p64(m.c_re_GxHxN) + 1j * sc.p64(m.c_im_GxHxN)
  assert c.shape == (2, h, n) and 0.8 < np.var(c) < 1.2  # complex normal
  dt = np.exp(sc.p64(m.log_dt_H))
  assert 1e-3 * (1 - 1e-6) <= dt.min() and dt.max() <= 0.1 * (1 + 1e-6)
  assert np.log(dt.max() / dt.min()) > 0.7 * np.log(100)  # log-uniform
  taps = sc.p64(m.shift_c_ExT)  # kaiming_uniform(a=sqrt 5): U(+-N^-1/2)
  assert taps.shape == (e, n_full)
  assert 0.9 * n_full**-0.5 < np.abs(taps).max() <= n_full**-0.5
  for lin in (m.qkv, m.out):  # PyTorch's nn.Linear default
    for p in (lin.kernel, lin.bias):
      assert 0.9 * e**-0.5 < np.abs(sc.p64(p)).max() <= e**-0.5
  assert 0.7 < np.std(sc.p64(m.d_H)) < 1.3
  assert 0.7 < np.std(sc.p64(m.shift_d_E)) < 1.3
  assert m.state_size() == e * (n_full - 1) + e * d * n_full


@pytest.mark.parametrize('length', [5, 37])  # fewer, more positions than taps
def test_shift_ssm_is_its_shift_register(length):
  m = mixer(1)
  k = sc.inputs(1, 2, length, E)
  got = np.asarray(jax.jit(m.shift_ssm)(k), np.float64)
  ref = shift_register64(m, k, (length, length))
  np.testing.assert_allclose(got, ref, atol=2e-6 * np.abs(ref).max())


@pytest.mark.parametrize('causal', [True, False])
def test_diag_ssm_is_its_recurrence(causal):
  m, length = mixer(2), 37
  u = sc.inputs(2, 2, length, E * 2)  # H = 4 heads of 2 x 2 channels
  got = np.asarray(jax.jit(m.diag_ssm, static_argnums=1)(u, causal))
  ref = diag_recurrence64(m, np.reshape(u, (2, length, 4, 4)), (37, 37), causal)
  ref = ref.reshape(2, length, E * 2)
  np.testing.assert_allclose(got, ref, atol=3e-6 * np.abs(ref).max())
  # The memory matters: the output is not its D u skip.
  skip = np.repeat(sc.p64(m.d_H), 4) * np.asarray(u)
  assert np.abs(ref - skip).max() > 0.5 * np.abs(ref).max()


# Both head_dims, both modes, two lengths; padded with noise under the pad.
@pytest.mark.parametrize(
  'length,causal,head_dim',
  [(37, True, 1), (37, False, 2), (16, True, 2), (16, False, 1)],
)
def test_module_equals_float64_step_by_step(length, causal, head_dim):
  m = mixer(head_dim)
  lengths = (length, length // 2 + 1)
  pad = sc.padding(lengths, length)
  x = sc.inputs(3, 2, length, E)
  noisy = jnp.where(pad[:, :, None], x, sc.inputs(4, 2, length, E, 10.0))
  out = sc.run(m, noisy, pad, causal)
  ref = layer64(m, x, lengths, causal)
  np.testing.assert_allclose(out, ref, atol=1e-5 * np.abs(ref).max())
  assert np.all(out[1, lengths[1] :] == 0)


def test_padding():
  # Bidirectional, where padding could leak backwards; the causal form is
  # checked padded against the float64 layer above.
  sc.check_padding_invariance(mixer(2), 37, E, False)


def test_causality_by_gradient():
  # FFT rounding: the future is zero up to float32 error, not bit-exact.
  sc.check_causality(mixer(2), 12, E, exact=False)


def test_finite_gradients():
  # Bidirectional: every parameter is used, the backward C included.
  sc.check_finite_gradients(mixer(2), 16, E, causal=False)


def test_bfloat16_under_jit():
  sc.check_bf16_close(H3, 37, E, False, atol=0.05, state_size=8, head_dim=2)


@pytest.mark.parametrize(
  'options,words',
  [
    ({'state_size': 7}, 'state_size must be even'),
    ({'state_size': 0}, 'state_size must be an integer >= 2'),
    ({'head_dim': 3}, 'head_dim must divide the width 8'),
    ({'head_dim': 0}, 'head_dim must be an integer >= 1'),
    ({'dt_min': 0.2, 'dt_max': 0.1}, '0 < dt_min <= dt_max'),
    ({'bidirectional': 'yes'}, 'bidirectional must be true or false'),
  ],
)
def test_bad_options_are_user_errors(options, words):
  with pytest.raises(UserError, match=words):
    sc.make(H3, emb_dim=E, **options)
