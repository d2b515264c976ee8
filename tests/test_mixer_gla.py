"""gla: the chunked form = a float64 step loop (module and core), the
linear-attention limit, strong decays, padding, causality, init, options."""

import functools

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models.attention import Mask
from models.attention.registry import get_core_class
from models.errors import UserError
import models.mixers.gla  # noqa: F401 (registers gla)
from models.mixers.gla import GLA, gla_chunked
from tests import ssm_checks as sc

B, E = 2, 16  # 2 heads: K = 4, V = 8 per head
# Read by tests/test_mixer_suite.py: small, fast options for its runs.
SUITE = dict(opts={'chunk_size': 16})
# Two sub-chunks of 16 per chunk: both halves of the intra-chunk scores.
CHUNK = 32


@functools.cache
def model(chunk=CHUNK):
  return sc.make(GLA, emb_dim=E, chunk_size=chunk)


def inputs(length, seed=0):
  return np.random.default_rng(seed).standard_normal((B, length, E))


def silu(t):
  return t / (1 + np.exp(-t))


def log_sigmoid(t):
  return -np.logaddexp(0.0, -t)


def gla_loop(q, k, v, g):
  """o_t = q_t S_t, S_t = diag(exp g_t) S_(t-1) + k_t^T v_t in float64,
  any leading dims [..., T, K] (the step-by-step reference)."""
  s = np.zeros(k.shape[:-2] + (k.shape[-1], v.shape[-1]))
  o = np.zeros(v.shape)
  for t in range(k.shape[-2]):
    kv = k[..., t, :, None] * v[..., t, None, :]
    s = np.exp(g[..., t, :])[..., None] * s + kv
    o[..., t, :] = np.einsum('...k,...kv->...v', q[..., t, :], s)
  return o


def reference(m, x, lengths, causal):
  """The whole mixer in float64 numpy over each example's real tokens."""
  h, kd, vd = m.num_heads, m.key_width, m.value_width
  out = np.zeros(x.shape)
  for i, n in enumerate(lengths):
    xs = np.asarray(x[i, :n], np.float64)
    heads = lambda t, w: t.reshape(n, h, w).swapaxes(0, 1)  # noqa: E731
    q = heads(xs @ sc.p64(m.q_proj.kernel), kd) * kd**-0.5
    k = heads(xs @ sc.p64(m.k_proj.kernel), kd)
    v = heads(xs @ sc.p64(m.v_proj.kernel), vd)

    def gate(d):
      logits = xs @ sc.p64(d.down.kernel) @ sc.p64(d.up.kernel) + sc.p64(
        d.up.bias
      )
      return heads(log_sigmoid(logits) / m.tau, kd)

    o = gla_loop(q, k, v, gate(m.fwd))
    if not causal:
      rev = lambda t: t[:, ::-1]  # noqa: E731
      o = o + rev(gla_loop(rev(q), rev(k), rev(v), rev(gate(m.bwd))))
    o = o.swapaxes(0, 1)  # [n, H, V]
    o = o / np.sqrt(np.mean(o**2, -1, keepdims=True) + 1e-6) * sc.p64(m.norm_V)
    o = o * silu(xs @ sc.p64(m.g_proj.kernel)).reshape(n, h, vd)
    out[i, :n] = o.reshape(n, h * vd) @ sc.p64(m.o_proj.kernel)
  return out


def close(got, ref, rtol=2e-5):
  scale = np.abs(ref).max()
  assert scale > 1e-3
  np.testing.assert_allclose(got, ref, atol=rtol * scale)


@pytest.mark.parametrize('causal', [True, False])
@pytest.mark.parametrize('length', [37, 5])  # 1 chunk + 5, within a chunk
def test_module_equals_step_loop(length, causal):
  m = model()
  x = inputs(length, seed=1)
  lengths = [length, length // 2 + 1]
  got = sc.run(m, x, sc.padding(lengths, length), causal)
  close(got, reference(m, x, lengths, causal))
  np.testing.assert_array_equal(got[1, lengths[1] :], 0.0)


def test_chunked_equals_chunk_size_one():
  """The parallel form (chunks of 32, sub-chunks of 16) = chunks of one
  position (a plain recurrence): the same parameters, float32."""
  length = 37
  x = inputs(length, seed=2)
  pad = sc.padding([length, 30], length)
  chunked = sc.run(model(), x, pad, False)
  stepwise = sc.run(model(1), x, pad, False)
  np.testing.assert_allclose(chunked, stepwise, atol=1e-5 * abs(chunked).max())


@functools.cache
def core():
  """jit(q, k, v, g -> outputs for several (chunk, sub-chunk) sizes): one
  compiled program for all the core tests."""
  sizes = ((1, 16), (8, 2), (16, 4), (64, 16))
  return jax.jit(lambda *t: [gla_chunked(*t, c, s) for c, s in sizes])


def core_inputs(length, seed):
  rng = np.random.default_rng(seed)
  q, k = rng.standard_normal((2, 3, length, 4))
  return q, k, rng.standard_normal((3, length, 5))


def test_core_equals_step_loop_with_strong_decays():
  """Rows of mild, strong and extreme gates (log-decay down to -60 per step,
  -960 over a chunk of 16): no overflow, and the float64 loop's values for
  every chunk size (L = 40: a multiple of 8, not of 16, shorter than 64)."""
  q, k, v = core_inputs(40, seed=3)
  rng = np.random.default_rng(4)
  g = (
    -np.abs(rng.standard_normal((3, 40, 4)))
    * np.array([0.1, 3, 60])[:, None, None]
  )
  g[:, 10:14] = 0.0  # identity steps (as padding)
  ref = gla_loop(q, k, v, g)
  for got in core()(q, k, v, g):
    got = np.asarray(got, np.float64)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, ref, atol=1e-5 * np.abs(ref).max())


def test_no_decay_is_unnormalised_linear_attention():
  """alpha = 1: o_t = q_t sum_(s<=t) k_s^T v_s, the direct float64 sum."""
  q, k, v = core_inputs(40, seed=5)
  scores = np.tril(np.einsum('xtk,xsk->xts', q, k))
  ref = np.einsum('xts,xsv->xtv', scores, v)
  for got in core()(q, k, v, np.zeros_like(q)):
    np.testing.assert_allclose(got, ref, atol=2e-5 * np.abs(ref).max())


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
  m = GLA(
    emb_dim=64,
    num_heads=4,
    max_length=128,
    dropout_rate=0.0,
    dtype=jnp.float32,
    rngs=nnx.Rngs(0),
  )
  assert (m.key_width, m.value_width) == (8, 16)  # expand_k 0.5, expand_v 1
  w = np.concatenate(
    [
      sc.p64(p.kernel).ravel()
      for p in (m.q_proj, m.k_proj, m.v_proj, m.g_proj, m.o_proj)
    ]
  )
  assert abs(w.std() - 0.02) < 0.002 and abs(w.mean()) < 0.002
  for gate in (m.fwd, m.bwd):
    assert sc.p64(gate.down.kernel).shape == (64, 16)
    assert sc.p64(gate.up.kernel).shape == (16, 32)
    np.testing.assert_array_equal(sc.p64(gate.up.bias), 0.0)
  assert not np.allclose(sc.p64(m.fwd.down.kernel), sc.p64(m.bwd.down.kernel))
  np.testing.assert_array_equal(sc.p64(m.norm_V), 1.0)
  assert m.state_size() == 4 * 8 * 16
  assert get_core_class('gla') is GLA and GLA.is_mixer and GLA.supports_causal


@pytest.mark.parametrize(
  'opts',
  [
    {'chunk_size': 0},
    {'expand_k': 0.1},  # width 1: 2 heads do not divide it
    {'expand_v': 'one'},
    {'gate_low_rank_dim': 0},
    {'gate_logit_normalizer': -1},
    {'initializer_range': True},
  ],
)
def test_option_errors(opts):
  with pytest.raises(UserError, match='^gla .*--config.model.attention'):
    sc.make(GLA, emb_dim=E, **opts)
