"""retnet: chunkwise = parallel (L x L) = recurrent retention, padding."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lra.errors import UserError
from models.attention import Mask
from models.attention.memory import core_memory_bytes
import models.attention.retnet as retnet
from models.positions import check_rotary, rotate
from tests import attention_oracle as ao

# Read by the shared suite (tests/test_attention_suite.py): retention has
# no softmax limit; its identity is tested here.
IDENTITY = 'the parallel and recurrent forms, tests/test_attn_retnet.py'
# GroupNorm'd rows sum to zero over D, which would leave the suite's
# all-ones causality cotangent only rounding noise: the suite runs it off.
SUITE = dict(
  opts={'chunk_size': 8, 'group_norm': False}, exact=None, identity=IDENTITY
)

B, H, D = 2, 2, 8


def make(**opts):
  return ao.make({'name': 'retnet', **opts}, num_heads=H, head_dim=D)


def gammas(core):
  return np.exp(np.asarray(core.log_gamma, np.float64))


def finish(num, rowsum, decay_sum, group_norm):
  """The paper's normalisers and GroupNorm, float64; [B, L, H, D]."""
  ok = decay_sum > 0
  scale = np.where(ok, 1 / np.sqrt(np.where(ok, decay_sum, 1)), 0)
  o = num * scale / np.maximum(np.abs(rowsum * scale), 1)
  if group_norm:
    o = o - o.mean(-1, keepdims=True)
    o = o / np.sqrt((o**2).mean(-1, keepdims=True) + retnet.EPS)
  return np.where(ok, o, 0.0)


def parallel_form(
  q, k, v, pad, causal, gamma, group_norm=True, score_norm=True
):
  """(Q K^T / sqrt(D) (.) Dm~) V, normalised, with a dense L x L decay mask
  Dm[n, m] = gamma^(n - m) (n >= m; two-sided: gamma^|n - m|)."""
  q, k, v = (np.asarray(t, np.float64) for t in (q, k, v))
  b, length, h, d = q.shape
  real = np.ones((b, length)) if pad is None else np.asarray(pad, np.float64)
  dist = np.arange(length)[:, None] - np.arange(length)[None, :]
  if causal:
    dm = np.where(dist >= 0, gamma[:, None, None] ** np.maximum(dist, 0), 0)
  else:
    dm = gamma[:, None, None] ** np.abs(dist)
  dm = dm[None] * real[:, None, None, :]  # [B, H, L, L]
  decay_sum = dm.sum(-1)  # [B, H, L]
  ok = decay_sum > 0
  dmt = dm / np.sqrt(np.where(ok, decay_sum, 1))[..., None]
  r = np.einsum('blhd,bmhd->bhlm', q, k) / np.sqrt(d) * dmt
  den = np.maximum(np.abs(r.sum(-1)), 1) if score_norm else np.ones(1)
  o = np.einsum('bhlm,bmhd->blhd', r / den[..., None], v)
  if group_norm:
    o = o - o.mean(-1, keepdims=True)
    o = o / np.sqrt((o**2).mean(-1, keepdims=True) + retnet.EPS)
  return np.where(ok.transpose(0, 2, 1)[..., None], o, 0.0)


def recurrent_sums(q, k, v, real, gamma, causal):
  """The step-by-step loop S_n = gamma S_(n-1) + k_n^T v_n, o_n = q_n S_n
  (and its normalisers z_n = gamma z_(n-1) + k_n, s_n = gamma s_(n-1) +
  real_n); non-causal: the same loop backwards, the diagonal once."""
  b, length, h, d = q.shape
  g = gamma[None, :, None, None]

  def loop(order):
    s_mat = np.zeros((b, h, d, d))
    z = np.zeros((b, h, d))
    s = np.zeros((b, h))
    num, rowsum, dsum = (np.zeros((b, length, h) + e) for e in ((d,), (), ()))
    for n in order:
      s_mat = g * s_mat + np.einsum('bhk,bhv->bhkv', k[:, n], v[:, n])
      z = g[..., 0] * z + k[:, n]
      s = gamma[None] * s + real[:, n, None]
      num[:, n] = np.einsum('bhk,bhkv->bhv', q[:, n], s_mat)
      rowsum[:, n] = np.einsum('bhk,bhk->bh', q[:, n], z)
      dsum[:, n] = s
    return num, rowsum, dsum

  fwd = loop(range(length))
  if causal:
    return fwd
  bwd = loop(range(length - 1, -1, -1))
  qk = np.einsum('blhk,blhk->blh', q, k)
  diag = (qk[..., None] * v, qk, real[:, :, None] * np.ones(h))
  return tuple(f + r - dg for f, r, dg in zip(fwd, bwd, diag))


def recurrent_form(q, k, v, pad, causal, gamma, group_norm=True):
  q, k, v = (np.asarray(t, np.float64) for t in (q, k, v))
  b, length, _, d = q.shape
  real = np.ones((b, length)) if pad is None else np.asarray(pad, np.float64)
  k, v = k * real[:, :, None, None], v * real[:, :, None, None]
  num, rowsum, dsum = recurrent_sums(q / np.sqrt(d), k, v, real, gamma, causal)
  return finish(num, rowsum[..., None], dsum[..., None], group_norm)


@pytest.mark.parametrize('causal', [False, True])
@pytest.mark.parametrize(
  'length,chunk,padded', [(37, 8, False), (37, 8, True), (100, 64, True)]
)
def test_chunkwise_equals_parallel_and_recurrent(length, chunk, padded, causal):
  # L = 100, C = 64: two chunks, the second padded inside the core.
  core = make(chunk_size=chunk)
  q, k, v = ao.qkv(seed=1, batch=B, length=length, heads=H, dim=D)
  pad = ao.padding([length, 20], length) if padded else None
  got = ao.run(core, q, k, v, pad, causal)
  par = parallel_form(q, k, v, pad, causal, gammas(core))
  rec = recurrent_form(q, k, v, pad, causal, gammas(core))
  np.testing.assert_allclose(par, rec, atol=1e-9)
  np.testing.assert_allclose(got, par, atol=2e-4)
  assert np.abs(got).max() > 0.5  # GroupNorm'd rows: unit variance


def test_without_group_norm():
  length, causal = 37, False
  core = make(chunk_size=8, group_norm=False, decay='spaced')
  q, k, v = ao.qkv(seed=2, batch=B, length=length, heads=H, dim=D, scale=3.0)
  pad = ao.padding([length, 20], length)
  got = ao.run(core, q, k, v, pad, causal)
  ref = parallel_form(q, k, v, pad, causal, gammas(core), group_norm=False)
  np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
  # The score normaliser max(|row sum|, 1) is active (changes rows).
  plain = parallel_form(
    q, k, v, pad, causal, gammas(core), group_norm=False, score_norm=False
  )
  assert np.abs(plain - ref).max() > 0.1


@pytest.mark.parametrize('chunk,causal', [(3, True), (8, False)])
def test_raw_retention_is_the_recurrence(chunk, causal):
  """o_n = q_n S_n, S_n = gamma S_(n-1) + k_n^T v_n (any chunk length)."""
  length = 37
  q, k, v = ao.qkv(seed=3, batch=B, length=length, heads=H, dim=D)
  lg = retnet.log_gammas(H, 'spaced')
  got = jax.jit(
    lambda q, k, v: retnet.retention(q, k, v, lg, causal=causal, chunk=chunk)
  )(q, k, v)
  real = np.ones((B, length))
  q, k, v = (np.asarray(t, np.float64) for t in (q, k, v))
  ref = recurrent_sums(q, k, v, real, np.exp(lg), causal)[0]
  np.testing.assert_allclose(np.asarray(got), ref, rtol=1e-5, atol=1e-4)


def test_decays():
  lg = retnet.log_gammas(4, 'paper')
  np.testing.assert_allclose(np.exp(lg), 1 - 2.0 ** -np.arange(5, 9))
  spaced = 1 - np.exp(retnet.log_gammas(5, 'spaced'))
  np.testing.assert_allclose(spaced[[0, -1]], [1 / 32, 1 / 512])
  assert np.all(np.diff(np.log(spaced)) < 0)
  # Many heads: log(gamma) stays distinct and < 0 far below float32's eps.
  lg = retnet.log_gammas(32, 'paper')
  assert np.all(lg < 0) and np.all(np.diff(lg) > 0)
  np.testing.assert_allclose(-lg[-1], 2.0**-36, rtol=1e-6)


def test_options_and_flags():
  for opts in ({'chunk_size': 0}, {'decay': 'linear'}, {'group_norm': 'yes'}):
    with pytest.raises(UserError, match='retnet'):
      make(**opts)
  core = make()
  assert core.chunk_size == 64 and core.supports_causal
  assert core.state_size() == H * D * D + H * D + H


def test_rotary_retention_is_shift_invariant():
  """rotary = 'scores': with q, k rotated by their positions the scores
  and the decay see offsets only, so shifting every position changes
  nothing (the paper's xPos-like retention)."""
  core = make(chunk_size=8)
  check_rotary(core, D)
  length = 37
  q, k, v = ao.qkv(seed=8, batch=B, length=length, heads=H, dim=D)
  pad = ao.padding([length, 20], length)
  f = jax.jit(
    lambda s: core(rotate(q, s), rotate(k, s), v, Mask(pad, False))[0]
  )
  out = np.asarray(f(0))
  np.testing.assert_allclose(np.asarray(f(11)), out, atol=1e-4)
  assert np.abs(out - ao.run(core, q, k, v, pad)).max() > 0.1


@pytest.mark.parametrize('causal', [False, True])
def test_padding_invariance_and_empty_rows(causal):
  length = 37
  core = make(chunk_size=8)
  q, k, v = ao.qkv(seed=4, batch=B, length=length, heads=H, dim=D)
  run = jax.jit(lambda q, k, v, pad: core(q, k, v, Mask(pad, causal))[0])
  pad = ao.padding([length, 20], length)
  out = np.asarray(run(q, k, v, pad))
  hide = ~pad[:, :, None, None]
  noise = 50 * jax.random.normal(jax.random.key(7), k.shape)
  out2 = run(
    jnp.where(hide, -noise, q),
    jnp.where(hide, noise, k),
    jnp.where(hide, noise, v),
    pad,
  )
  real = np.asarray(pad)
  np.testing.assert_allclose(np.asarray(out2)[real], out[real], atol=1e-5)
  # An example with no real token gets zeros, with finite gradients.
  empty = ao.padding([length, 0], length)
  out = np.asarray(run(q, k, v, empty))
  np.testing.assert_array_equal(out[1], 0.0)
  assert np.isfinite(out).all()
  loss = lambda *a: jnp.sum(run(*a, empty) ** 2)  # noqa: E731
  for g in jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v):
    assert np.isfinite(np.asarray(g)).all()
    np.testing.assert_array_equal(np.asarray(g)[1], 0.0)


def test_causal_by_gradient():
  # Without GroupNorm: time_gradients sums the outputs over D, and a
  # GroupNorm'd row sums to zero.
  length = 37
  core = make(chunk_size=8, group_norm=False)
  q, k, v = ao.qkv(seed=5, batch=B, length=length, heads=H, dim=D)
  pad = ao.padding([length, 30], length)
  ts = (0, 7, 8, 20, 36)
  g_Tx3xL = ao.time_gradients(core, q, k, v, ts, pad)
  for row, t in zip(g_Tx3xL, ts):
    assert (row[:, t + 1 :] == 0).all(), t  # nothing after t
    assert (row[1:, : t + 1] > 0).all(), t  # every earlier key and value
  # Bidirectional: the output at t sees keys after t.
  g_Tx3xL = ao.time_gradients(core, q, k, v, ts, pad, causal=False)
  assert (g_Tx3xL[1, 1:, 8:length] > 0).all()


def test_bfloat16_and_jit():
  length = 37
  q, k, v = ao.qkv(seed=6, batch=B, length=length, heads=H, dim=D)
  pad = ao.padding([length, 20], length)
  ref = ao.run(make(chunk_size=8), q, k, v, pad)
  core = ao.make(
    {'name': 'retnet', 'chunk_size': 8},
    num_heads=H,
    head_dim=D,
    dtype=jnp.bfloat16,
  )
  lo = [t.astype(jnp.bfloat16) for t in (q, k, v)]
  out = jax.jit(lambda q, k, v: core(q, k, v, Mask(pad, False))[0])(*lo)
  assert out.dtype == jnp.bfloat16
  out = np.asarray(out, np.float32)
  assert np.isfinite(out).all()
  # GroupNorm'd outputs have unit scale; bf16 inputs round at 2^-8.
  np.testing.assert_allclose(out, ref, atol=0.15)


def test_memory_grows_linearly():
  """Non-causal: both chunkwise passes (the causal one is one of them)."""
  opts = {'name': 'retnet'}
  small = core_memory_bytes(opts, 1024)
  large = core_memory_bytes(opts, 4096)
  print(f'retnet: {small} -> {large} bytes')
  assert large / small <= 5  # exact softmax attention: about 16
