"""Synthesizer: each mode against its written-out logits, limits, errors."""

from attention_oracle import (
  allowed_mask,
  dense_reference,
  depends_on_future,
  full_pattern,
  make,
  padding,
  qkv,
  run,
)
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lra.errors import UserError
from models.attention import Mask
import models.attention.synthesizer  # noqa: F401

B, L, H, D, MAX = 2, 37, 2, 8, 48
LENGTHS = (L, 20)
MODES = ('random', 'factorized_random', 'dense')


def core(mode, **opts):
  return make(
    {'name': 'synthesizer', 'mode': mode, **opts},
    num_heads=H,
    head_dim=D,
    max_length=MAX,
  )


def params(c):
  return {
    '/'.join(map(str, path)): p
    for path, p in nnx.iter_graph(c)
    if isinstance(p, nnx.Param)
  }


def randomise(c, scale=1.0):
  """Unit-scale random parameters, so the synthetic logits matter."""
  for i, p in enumerate(params(c).values()):
    p[...] = scale * jax.random.normal(jax.random.key(i), p[...].shape)
  return c


def synthetic_logits(c, q, m):
  """S [B|1, H, L, M] written out in numpy from the core's parameters."""
  length = q.shape[1]
  if c.mode == 'random':
    return np.asarray(c.table_HxNxN[...])[None, :, :length, :m]
  if c.mode == 'factorized_random':
    r1 = np.asarray(c.r1_HxNxK[...])[:, :length]
    r2 = np.asarray(c.r2_HxNxK[...])[:, :m]
    return np.einsum('hlk,hmk->hlm', r1, r2)[None]
  q = np.asarray(q, np.float64)
  hidden = np.maximum(
    np.einsum('blhd,hde->blhe', q, np.asarray(c.w1_HxDxD[...]))
    + np.asarray(c.b1_HxD[...]),
    0,
  )
  return (
    np.einsum('blhe,hem->bhlm', hidden, np.asarray(c.w2_HxDxN[...])[..., :m])
    + np.asarray(c.b2_HxN[...])[None, :, None, :m]
  )


def reference(c, q, k, v, pad, causal, mix):
  """softmax(S [+ q.k / sqrt(D)] | allowed) v in float64."""
  s = synthetic_logits(c, q, k.shape[1])
  q64, k64, v64 = (np.asarray(t, np.float64) for t in (q, k, v))
  if mix:
    s = s + np.einsum('blhd,bmhd->bhlm', q64, k64) / np.sqrt(D)
  allowed = np.broadcast_to(
    allowed_mask(full_pattern(q.shape[1], k.shape[1]), pad, causal),
    (B, H, q.shape[1], k.shape[1]),
  )
  s = np.where(allowed, np.broadcast_to(s, allowed.shape), -np.inf)
  top = np.max(s, -1, keepdims=True)
  w = np.where(allowed, np.exp(s - np.where(np.isfinite(top), top, 0)), 0)
  w = w / np.maximum(w.sum(-1, keepdims=True), 1e-300)
  return np.einsum('bhlm,bmhd->blhd', w, v64)


@pytest.mark.parametrize('mode', MODES)
def test_equals_written_out_logits(mode):
  q, k, v = qkv(1, B, L, H, D)
  pad = padding(LENGTHS, L)
  for mix in (False, True):
    c = randomise(core(mode, mix_dot_product=mix))
    for causal in (False, True):
      got = run(c, q, k, v, pad, causal)
      want = reference(c, q, k, v, pad, causal, mix)
      np.testing.assert_allclose(got, want, atol=2e-5, err_msg=str(causal))
  # The synthetic logits change the output (not plain softmax).
  plain = dense_reference(q, k, v, allowed_mask(full_pattern(L), pad))
  assert np.abs(run(c, q, k, v, pad) - plain).max() > 1e-2


@pytest.mark.parametrize('mode', MODES)
def test_zero_synthetic_with_dot_product_is_exact_softmax(mode):
  c = core(mode, mix_dot_product=True)
  for p in params(c).values():
    p[...] = jnp.zeros_like(p[...])
  q, k, v = qkv(2, B, L, H, D)
  pad = padding(LENGTHS, L)
  for causal in (False, True):
    want = dense_reference(q, k, v, allowed_mask(full_pattern(L), pad, causal))
    np.testing.assert_allclose(
      run(c, q, k, v, pad, causal), want, atol=2e-5, err_msg=str(causal)
    )


@pytest.mark.parametrize('mode', MODES)
def test_padding_causality_and_gradients(mode):
  c = randomise(core(mode, mix_dot_product=mode == 'dense'), 3.0)
  q, k, v = qkv(3, B, L, H, D)
  # Padding invariance, including padded queries.
  pad = padding(LENGTHS, L)
  out1 = run(c, q, k, v, pad)
  hide = ~pad[:, :, None, None]
  noise = 50 * jax.random.normal(jax.random.key(7), k.shape)
  out2 = run(
    c,
    jnp.where(hide, -noise, q),
    jnp.where(hide, noise, k),
    jnp.where(hide, -noise, v),
    pad,
  )
  real = np.asarray(pad)
  np.testing.assert_allclose(out1[real], out2[real], atol=1e-5)
  # A fully padded example: zeros, finite gradients.
  pad0 = padding((L, 0), L)
  out = run(c, q, k, v, pad0)
  assert np.isfinite(out).all()
  np.testing.assert_array_equal(out[1], 0.0)
  grads = jax.grad(
    lambda q, k, v: jnp.sum(c(q, k, v, Mask(pad0, False))[0] ** 2),
    argnums=(0, 1, 2),
  )(q, k, v)
  for g in grads:
    assert np.isfinite(np.asarray(g)).all()
  # Causal: the output at t depends on nothing after t, but on the past.
  for t in (0, 15, 30):
    assert not depends_on_future(c, q, k, v, t, pad), t
  g = jax.grad(lambda v: c(q, k, v, Mask(pad, True))[0][:, 30].sum())(v)
  assert np.abs(np.asarray(g)[:, :30]).sum() > 0


def test_dropout_uses_the_key():
  c = core('random', mix_dot_product=True)
  c.dropout_rate = 0.5
  q, k, v = qkv(4, B, L, H, D)
  mask = Mask(padding(LENGTHS, L), False)
  a = c(q, k, v, mask, rngs=jax.random.key(0))[0]
  b = c(q, k, v, mask, rngs=jax.random.key(0))[0]
  d = c(q, k, v, mask, rngs=jax.random.key(1))[0]
  np.testing.assert_array_equal(a, b)
  assert not np.allclose(a, d)


def test_too_long_input_and_bad_options():
  q, k, v = qkv(5, 1, MAX + 1, H, D)
  with pytest.raises(UserError, match=f'length {MAX + 1}.*max_length {MAX}'):
    core('random')(q, k, v, Mask(None, False))
  for opts, word in (
    ({'mode': 'nope'}, 'mode'),
    ({'rank': 0}, 'rank'),
    ({'mix_dot_product': 'yes'}, 'mix_dot_product'),
  ):
    with pytest.raises(UserError, match=word):
      make({'name': 'synthesizer', **opts})


def test_parameters_sized_by_max_length():
  shapes = {
    mode: {n: p[...].shape for n, p in params(core(mode, rank=3)).items()}
    for mode in MODES
  }
  assert shapes['random'] == {'table_HxNxN': (H, MAX, MAX)}
  assert shapes['factorized_random'] == {
    'r1_HxNxK': (H, MAX, 3),
    'r2_HxNxK': (H, MAX, 3),
  }
  assert shapes['dense']['w2_HxDxN'] == (H, D, MAX)


# The shared suite's settings for this core (tests/test_attention_suite.py).
def _zero_synthetic(core):
  """Synthesizer's exact limit: mixed with q.k and no synthetic logits."""
  for _, p in nnx.iter_graph(core):
    if isinstance(p, nnx.Param):
      p[...] = jnp.zeros_like(p[...])


SUITE = dict(
  opts={'mode': 'random'},
  exact={'mode': 'dense', 'mix_dot_product': True},
  hook=_zero_synthetic,
)
