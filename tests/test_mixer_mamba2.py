"""mamba2: the chunked SSD = a float64 step loop = Mamba's selective scan in
its scalar-decay limit; the whole mixer = a float64 reference; padding;
causality; initialisation; options."""

import functools

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models.attention import Mask
from models.attention.registry import get_core_class
from models.errors import UserError
from models.mixers.mamba import selective_scan
from models.mixers.mamba2 import Mamba2, ssd

B, E = 2, 8
# Read by tests/test_mixer_suite.py: small, fast options for its runs.
SUITE = dict(opts={'state_size': 8, 'head_dim': 8, 'chunk_size': 16})
# The mixer of most tests: I = 16 channels in H = 4 heads of P = 4, N = 4.
OPTS = dict(state_size=4, head_dim=4, chunk_size=8)


def make(seed=0, **opts):
  return Mamba2(
    emb_dim=E,
    num_heads=2,
    max_length=128,
    dropout_rate=0.0,
    dtype=jnp.float32,
    rngs=nnx.Rngs(seed),
    **{**OPTS, **opts},
  )


@functools.cache
def mixer():
  """The shared mixer (one compiled program per shape and mask kind)."""
  return make()


@functools.partial(jax.jit, static_argnums=(0, 4))
def _apply(graphdef, state, x, pad, causal):
  return nnx.merge(graphdef, state)(x, Mask(pad, causal))[0]


def run(m, x, pad, causal):
  return np.asarray(_apply(*nnx.split(m), x, pad, causal), np.float64)


def normal(seed, *shape):
  return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def padding(lengths, length):
  return np.arange(length)[None, :] < np.asarray(lengths)[:, None]


def f64(t):
  """An array or an nnx parameter as float64 numpy."""
  return np.asarray(t[...] if isinstance(t, nnx.Variable) else t, np.float64)


def softplus(t):
  return np.logaddexp(0.0, t)


def silu(t):
  return t / (1 + np.exp(-t))


def ssd_loop(x, dt, a, bm, cm):
  """h_t = exp(dt_t A_h) h + dt_t x_t B_t^T, y_t = h_t C_t, float64:
  x [X, L, H, P], dt [X, L, H], a [X, H], bm, cm [X, L, N]."""
  x, dt, a, bm, cm = map(f64, (x, dt, a, bm, cm))
  rows, length, h, p = x.shape
  state = np.zeros((rows, h, p, bm.shape[-1]))
  y = np.zeros_like(x)
  for t in range(length):
    state = np.exp(dt[:, t] * a)[..., None, None] * state
    state = (
      state + (dt[:, t, :, None] * x[:, t])[..., None] * bm[:, t, None, None, :]
    )
    y[:, t] = np.einsum('xhpn,xn->xhp', state, cm[:, t])
  return y


def ssd_inputs(seed, length, rows=2, h=2, p=3, n=4):
  """Random SSD inputs with identity steps (dt = 0) inside, as padding."""
  x = normal(seed, rows, length, h, p)
  dt = softplus(normal(seed + 1, rows, length, h) - 1).astype(np.float32)
  dt = dt * (np.arange(length) % 7 != 3)[None, :, None]
  a = -np.random.default_rng(seed + 2).uniform(1, 16, (rows, h))
  bm, cm = normal(seed + 3, 2, rows, length, n)
  return x, dt, a.astype(np.float32), bm, cm


@pytest.mark.parametrize('length', [37, 32, 5])
def test_chunked_ssd_equals_step_loop(length):
  """Chunks of 8 (37: a partial last chunk; 32: whole chunks), 64 (longer
  than L: one quadratic chunk) and 1 (the recurrence itself)."""
  inputs = ssd_inputs(1, length)
  chunked = jax.jit(lambda *t: [ssd(*t, c) for c in (8, 64, 1)])(*inputs)
  ref = ssd_loop(*inputs)
  scale = np.abs(ref).max()
  assert scale > 0.1
  for got in chunked:
    np.testing.assert_allclose(f64(got), ref, atol=2e-6 * scale)


@pytest.mark.parametrize('heads', [1, 2])
def test_ssd_is_mambas_scan_with_scalar_decay(heads):
  """Mamba's selective scan with dt_t the same over a head's channels and A
  constant over its channels and states (one value per head) is the SSD
  recurrence: both float32 forms agree."""
  length, p, n = 37, 3, 4
  x, dt, a, bm, cm = ssd_inputs(2, length, h=heads, p=p, n=n)
  rows = x.shape[0]

  @jax.jit
  def both(x, dt, a, bm, cm):
    y_ssd = ssd(x, dt, a, bm, cm, 8)
    u_XxLxI = x.reshape(rows, length, heads * p)
    dt_XxLxI = jnp.repeat(dt, p, axis=-1)
    a_XxIxN = jnp.broadcast_to(
      jnp.repeat(a, p, axis=-1)[..., None], (rows, heads * p, n)
    )
    y_scan = selective_scan(u_XxLxI, dt_XxLxI, a_XxIxN, bm, cm, 16)
    return y_ssd.reshape(rows, length, heads * p), y_scan

  y_ssd, y_scan = map(f64, both(x, dt, a, bm, cm))
  scale = np.abs(y_scan).max()
  assert scale > 0.1
  np.testing.assert_allclose(y_ssd, y_scan, atol=2e-6 * scale)


def direction_loop(d, xbc, dt_raw, real):
  """One direction step by step in float64: conv, SiLU, dt, the SSD
  recurrence per head, + D x; [B, L, I]."""
  w, bias = f64(d.conv_KxF), f64(d.conv_bias_F)
  k = w.shape[0]
  b, length, _ = xbc.shape
  conv = np.tile(bias, (b, length, 1))
  for t in range(length):
    for j in range(k):
      if t - k + 1 + j >= 0:
        conv[:, t] += w[j] * xbc[:, t - k + 1 + j]
  u = silu(conv) * real[..., None]
  i, n, h = d.inner, d.state, d.heads
  x = u[..., :i].reshape(b, length, h, i // h)
  bm, cm = u[..., i : i + n], u[..., i + n :]
  dt = softplus(dt_raw + f64(d.dt_bias_H)) * real[..., None]
  a = np.broadcast_to(-np.exp(f64(d.a_log_H)), (b, h))
  y = ssd_loop(x, dt, a, bm, cm) + f64(d.d_H)[:, None] * x
  return y.reshape(b, length, i)


def reference(m, x, pad, causal):
  """The whole mixer in float64 numpy from the module's own parameters."""
  x = f64(x)
  b, length, _ = x.shape
  real = np.ones((b, length)) if pad is None else f64(pad)
  i, n = m.inner, m.num_states
  proj = (x * real[..., None]) @ f64(m.in_proj.kernel)
  z = proj[..., :i]
  xbc = proj[..., i : 2 * i + 2 * n] * real[..., None]
  dt_raw = proj[..., 2 * i + 2 * n :]
  y = direction_loop(m.fwd, xbc, dt_raw, real)
  if not causal:
    back = direction_loop(m.bwd, xbc[:, ::-1], dt_raw[:, ::-1], real[:, ::-1])
    y = y + back[:, ::-1]
  g = y * silu(z)
  g = g / np.sqrt(np.mean(g**2, axis=-1, keepdims=True) + 1e-5)
  g = g * f64(m.norm_I)
  return g @ f64(m.out_proj.kernel) * real[..., None]


@pytest.mark.parametrize('causal', [True, False])
@pytest.mark.parametrize('length', [37, 5])
def test_mixer_equals_float64_reference(length, causal):
  """Chunks of 8: 37 ends in a partial chunk, 5 is shorter than one."""
  m = mixer()
  x = normal(3, B, length, E)
  pad = padding([length, max(1, length - 12)], length)
  got = run(m, x, pad, causal)
  ref = reference(m, x, pad, causal)
  scale = np.abs(ref).max()
  assert scale > 0.1
  np.testing.assert_allclose(got, ref, atol=1e-5 * scale)


@pytest.mark.parametrize('causal', [True, False])
def test_padding_is_invisible(causal):
  length, short = 37, 25
  m = mixer()
  x = normal(4, B, length, E)
  pad = padding([length, short], length)
  out = run(m, x, pad, causal)
  noise = 30 * normal(5, B, length, E)
  out2 = run(m, np.where(pad[..., None], x, noise), pad, causal)
  np.testing.assert_allclose(out2, out, atol=1e-6)
  np.testing.assert_array_equal(out[1, short:], 0.0)
  # The padded example's real outputs are those of its tokens alone.
  alone = reference(m, x[1:, :short], None, causal)
  np.testing.assert_allclose(out[1, :short], alone[0], atol=1e-5)
  # No real token: zeros, and finite gradients.
  empty = padding([length, 0], length)
  np.testing.assert_array_equal(run(m, x, empty, causal)[1], 0.0)
  if causal:  # the bidirectional program runs both directions
    return
  graphdef, state = nnx.split(m)

  @jax.jit
  @jax.grad
  def grad_fn(x):
    return jnp.sum(_apply(graphdef, state, x, empty, causal) ** 2)

  grad = np.asarray(grad_fn(x))
  assert np.isfinite(grad).all()
  np.testing.assert_array_equal(grad[1], 0.0)
  assert np.abs(grad[0]).sum() > 0


def test_causal_by_perturbation():
  """Causal: changing token s moves no output before s (bit for bit) and
  every output from s on; a padded token moves nothing."""
  length = 37
  m = mixer()
  x = normal(6, B, length, E)
  pad = padding([length, 30], length)
  base = run(m, x, pad, True)
  for s in (0, 7, 8, 20, 36):
    x2 = x.copy()
    x2[:, s] += 3 * normal(7 + s, B, E)
    moved = np.abs(run(m, x2, pad, True) - base).max(-1)  # [B, L]
    assert (moved[:, :s] == 0).all(), s
    assert (moved[0, s:] > 0).all(), s
    assert (moved[1] > 0).any() == (s < 30), s


def test_initialisation():
  m = make(head_dim=64, state_size=16)
  # head_dim 64 > I = 16: one head of all 16 channels.
  assert (m.inner, m.heads, m.head_dim) == (2 * E, 1, 2 * E)
  assert m.state_size() == 16 * 16 + (16 + 2 * 16) * 3
  m = make(head_dim=2, seed=1)  # 8 heads
  assert m.in_proj.kernel.shape == (E, 2 * 16 + 2 * 4 + 8)
  assert np.abs(f64(m.in_proj.kernel)).max() <= E**-0.5
  assert np.abs(f64(m.out_proj.kernel)).max() <= 16**-0.5
  for d in (m.fwd, m.bwd):
    a = np.exp(f64(d.a_log_H))
    assert a.shape == (8,) and a.min() >= 1 and a.max() <= 16
    assert a.max() - a.min() > 3  # drawn, not constant
    dt = softplus(f64(d.dt_bias_H))
    assert dt.min() >= 0.001 * (1 - 1e-5) and dt.max() <= 0.1 * (1 + 1e-5)
    np.testing.assert_array_equal(f64(d.d_H), 1.0)
    assert np.abs(f64(d.conv_KxF)).max() <= 0.5  # K^-1/2, K = 4
    assert d.conv_KxF.shape == (4, 16 + 2 * 4)
  np.testing.assert_array_equal(f64(m.norm_I), 1.0)
  assert not np.allclose(f64(m.fwd.dt_bias_H), f64(m.bwd.dt_bias_H))


def test_options_and_registry():
  assert get_core_class('mamba2') is Mamba2
  assert Mamba2.is_mixer and Mamba2.supports_causal
  bad = (
    {'head_dim': 3},  # does not divide I = 16
    {'expand': 0},
    {'state_size': 1.5},
    {'chunk_size': 0},
    {'dt_min': 0.5, 'dt_max': 0.1},
  )
  for opts in bad:
    with pytest.raises(UserError, match='mamba2') as info:
      make(**opts)
    assert '\n' not in str(info.value)
