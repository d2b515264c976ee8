"""deltanet: the WY-chunked form = a float64 step loop (module and core,
plain and gated), beta = 0 keeps the state, padding, causality, init,
options."""

import functools

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models.attention import Mask
from models.attention.registry import get_core_class
from models.errors import UserError
import models.mixers.deltanet  # noqa: F401 (registers deltanet)
from models.mixers.deltanet import DeltaNet, delta_chunked
from tests import ssm_checks as sc

B, E = 2, 16  # 2 heads: K = V = 8 per head
# Read by tests/test_mixer_suite.py: small, fast options for its runs.
SUITE = dict(opts={'chunk_size': 16})
CHUNK = 16


@functools.cache
def model(chunk=CHUNK, gated=False):
  return sc.make(DeltaNet, emb_dim=E, chunk_size=chunk, gated=gated)


def inputs(length, seed=0):
  return np.random.default_rng(seed).standard_normal((B, length, E))


def silu(t):
  return t / (1 + np.exp(-t))


def delta_loop(q, k, v, beta, g):
  """o_t = q_t S_t, S_t = a_t S_(t-1) + k_t^T beta_t (v_t - k_t a_t
  S_(t-1)), a_t = exp g_t, in float64 step by step; [..., T, K] rows."""
  s = np.zeros(k.shape[:-2] + (k.shape[-1], v.shape[-1]))
  o = np.zeros(v.shape)
  for t in range(k.shape[-2]):
    s = np.exp(g[..., t])[..., None, None] * s
    k_t = k[..., t, :]
    u = beta[..., t, None] * (
      v[..., t, :] - np.einsum('...k,...kv->...v', k_t, s)
    )
    s = s + k_t[..., :, None] * u[..., None, :]
    o[..., t, :] = np.einsum('...k,...kv->...v', q[..., t, :], s)
  return o


def conv_silu(t, w):
  """SiLU of the causal depthwise conv (zeros before the start), [T, F]."""
  if w is None:
    return silu(t)
  width = w.shape[0]
  y = np.zeros_like(t)
  for j in range(width):
    shift = width - 1 - j  # w_j reads t - shift
    y[shift:] += w[j] * t[: len(t) - shift]
  return silu(y)


def direction64(m, d, xs):
  """One direction over tokens xs [T, E] in their order: o [H, T, V]."""
  h, kd, vd = m.num_heads, m.key_width, m.value_width
  n = len(xs)
  heads = lambda t, w: t.reshape(n, h, w).swapaxes(0, 1)  # noqa: E731
  w = lambda c: None if c is None else sc.p64(c)  # noqa: E731
  q, k, v = (
    conv_silu(xs @ sc.p64(p.kernel), w(c))
    for p, c in (
      (m.q_proj, d.q_conv),
      (m.k_proj, d.k_conv),
      (m.v_proj, d.v_conv),
    )
  )
  l2 = lambda t: t / np.sqrt(np.sum(t**2, -1, keepdims=True) + 1e-6)  # noqa: E731
  q = l2(heads(q, kd)) * kd**-0.5
  k = l2(heads(k, kd))
  beta = 1 / (1 + np.exp(-(xs @ sc.p64(d.b_proj.kernel)))).T
  g = np.zeros_like(beta)
  if m.gated:
    a = xs @ sc.p64(d.a_proj.kernel) + sc.p64(d.dt_bias_H)
    g = (-np.exp(sc.p64(d.a_log_H)) * np.logaddexp(0.0, a)).T
  return delta_loop(q, k, heads(v, vd), beta, g)


def reference(m, x, lengths, causal):
  """The whole mixer in float64 numpy over each example's real tokens."""
  h, vd = m.num_heads, m.value_width
  out = np.zeros(x.shape)
  for i, n in enumerate(lengths):
    xs = np.asarray(x[i, :n], np.float64)
    o = direction64(m, m.fwd, xs)
    if not causal:
      o = o + direction64(m, m.bwd, xs[::-1])[:, ::-1]
    o = o.swapaxes(0, 1)  # [n, H, V]
    o = o / np.sqrt(np.mean(o**2, -1, keepdims=True) + 1e-6)
    o = o * sc.p64(m.norm_V)
    if m.gated:
      o = o * silu(xs @ sc.p64(m.g_proj.kernel)).reshape(n, h, vd)
    out[i, :n] = o.reshape(n, h * vd) @ sc.p64(m.o_proj.kernel)
  return out


def close(got, ref, rtol=2e-5):
  scale = np.abs(ref).max()
  assert scale > 1e-3
  np.testing.assert_allclose(got, ref, atol=rtol * scale)


@pytest.mark.parametrize(
  'length,causal,gated',
  [
    (37, True, False),  # 2 chunks + 5
    (37, False, False),
    (5, False, False),  # within a chunk
    (37, False, True),
  ],
)
def test_module_equals_step_loop(length, causal, gated):
  m = model(gated=gated)
  x = inputs(length, seed=1)
  lengths = [length, length // 2 + 1]
  got = sc.run(m, x, sc.padding(lengths, length), causal)
  close(got, reference(m, x, lengths, causal))
  np.testing.assert_array_equal(got[1, lengths[1] :], 0.0)


def test_chunked_equals_chunk_size_one():
  """The WY form in chunks of 16 = chunks of one position (a plain
  recurrence): the same parameters, float32."""
  length = 37
  x = inputs(length, seed=2)
  pad = sc.padding([length, 30], length)
  chunked = sc.run(model(), x, pad, False)
  stepwise = sc.run(model(1), x, pad, False)
  np.testing.assert_allclose(chunked, stepwise, atol=1e-5 * abs(chunked).max())


@functools.cache
def core():
  """jit(q, k, v, beta, g -> outputs for chunks of 1, 8, 16 and 64): one
  compiled program for all the core tests."""
  return jax.jit(
    lambda *t: [delta_chunked(*t, c) for c in (1, 8, 16, 64)]  # noqa: E731
  )


def core_inputs(seed, length=40):
  """Rows of ungated, mildly and strongly gated steps (log-decay down to
  -30 a step), unit keys, beta in (0, 1) and 0 on positions 10..17."""
  rng = np.random.default_rng(seed)
  q, k = rng.standard_normal((2, 3, length, 4))
  k = k / np.linalg.norm(k, axis=-1, keepdims=True)
  v = rng.standard_normal((3, length, 5))
  beta = 1 / (1 + np.exp(-rng.standard_normal((3, length))))
  beta[:, 10:18] = 0.0
  g = (
    -np.abs(rng.standard_normal((3, length))) * np.array([0, 0.3, 30])[:, None]
  )
  return q, k, v, beta, g


def test_core_equals_step_loop():
  """Every chunk size (L = 40: a multiple of 8, not of 16, shorter than
  64) gives the float64 loop's values."""
  q, k, v, beta, g = core_inputs(3)
  ref = delta_loop(q, k, v, beta, g)
  for got in core()(q, k, v, beta, g):
    got = np.asarray(got, np.float64)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, ref, atol=1e-5 * np.abs(ref).max())


def test_zero_beta_keeps_the_state():
  """beta = 0 (and no decay): from the zero state every output is exactly
  zero; after some real steps, the state is kept, o_t = q_t S_9 on the
  beta = 0 stretch 10..17."""
  q, k, v, beta, g = core_inputs(4)
  g[:] = 0.0
  for got in core()(q, k, v, np.zeros_like(beta), g):
    np.testing.assert_array_equal(np.asarray(got), 0.0)
  s9 = np.zeros((3, 4, 5))
  for t in range(10):
    u = beta[:, t, None] * (v[:, t] - np.einsum('xk,xkv->xv', k[:, t], s9))
    s9 = s9 + k[:, t, :, None] * u[:, None, :]
  kept = np.einsum('xtk,xkv->xtv', q[:, 10:18], s9)
  for got in core()(q, k, v, beta, g):
    np.testing.assert_allclose(got[:, 10:18], kept, atol=1e-5)


def test_padding_and_causality():
  length = 37
  m = model()
  x = inputs(length, seed=6)
  pad = sc.padding([length, 0], length)
  out = sc.run(m, x, pad, True)
  # An all-padded example: zeros; the other one as without padding.
  np.testing.assert_array_equal(out[1], 0.0)
  np.testing.assert_allclose(
    out[0], sc.run(m, x, None, True)[0], atol=1e-6 * np.abs(out).max()
  )
  # Padded content changes nothing.
  noisy = np.where(np.asarray(pad)[..., None], x, 100.0)
  np.testing.assert_array_equal(sc.run(m, noisy, pad, True), out)
  # Causal: a change at t0 leaves every earlier output exactly as it was.
  t0 = 20
  later = x.copy()
  later[:, t0] += 1.0
  moved = sc.run(m, later, pad, True)
  np.testing.assert_array_equal(moved[0, :t0], out[0, :t0])
  assert np.abs(moved[0, t0:] - out[0, t0:]).max() > 0
  # Finite gradients with the all-padded example, none reaching it.
  graphdef, state = nnx.split(m)

  @jax.jit
  def grad(x):
    def loss(x):
      y = nnx.merge(graphdef, state)(x, Mask(pad, False))[0]
      return jnp.sum(y**2)

    return jax.grad(loss)(x)

  g = np.asarray(grad(jnp.asarray(x, jnp.float32)))
  assert np.isfinite(g).all() and np.abs(g[0]).max() > 0
  np.testing.assert_array_equal(g[1], 0.0)


def test_initialisation_and_state_size():
  m = DeltaNet(
    emb_dim=64,
    num_heads=4,
    max_length=128,
    dropout_rate=0.0,
    dtype=jnp.float32,
    rngs=nnx.Rngs(0),
    gated=True,
  )
  assert (m.key_width, m.value_width, m.conv_width) == (16, 16, 4)
  kernels = [m.q_proj, m.k_proj, m.v_proj, m.g_proj, m.o_proj]
  w = np.concatenate([sc.p64(p.kernel).ravel() for p in kernels])
  assert abs(w.std() - 0.02) < 0.002 and abs(w.mean()) < 0.002
  for d in (m.fwd, m.bwd):
    assert sc.p64(d.q_conv).shape == (4, 64)
    assert abs(sc.p64(d.v_conv).std() - 0.02) < 0.005
    a = np.exp(sc.p64(d.a_log_H))
    assert ((a > 0) & (a < 16)).all()
    dt = np.logaddexp(0.0, sc.p64(d.dt_bias_H))
    assert ((dt > 0.001 * (1 - 1e-5)) & (dt < 0.1 * (1 + 1e-5))).all()
  assert not np.allclose(
    sc.p64(m.fwd.b_proj.kernel), sc.p64(m.bwd.b_proj.kernel)
  )
  np.testing.assert_array_equal(sc.p64(m.norm_V), 1.0)
  assert m.state_size() == 4 * 16 * 16 + 3 * (64 + 64 + 64)
  plain = sc.make(DeltaNet, emb_dim=E, short_conv=0)
  assert plain.fwd.q_conv is None and plain.g_proj is None
  assert plain.state_size() == 2 * 8 * 8
  assert get_core_class('deltanet') is DeltaNet
  assert DeltaNet.is_mixer and DeltaNet.supports_causal


@pytest.mark.parametrize(
  'opts',
  [
    {'chunk_size': 0},
    {'short_conv': -1},
    {'expand_k': 0.1},  # width 1: 2 heads do not divide it
    {'expand_v': 0},
    {'gated': 'yes'},
    {'initializer_range': 'small'},
  ],
)
def test_option_errors(opts):
  with pytest.raises(UserError, match='^deltanet .*--config.model.attention'):
    sc.make(DeltaNet, emb_dim=E, **opts)
