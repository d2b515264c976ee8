"""performer: kernel identity, approximation of softmax, random features."""

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lra.errors import UserError
from models.attention import Mask
from models.attention.memory import core_memory_bytes
import models.attention.performer  # noqa: F401
from models.attention.performer import RandomFeatures
from tests import attention_oracle as ao
from tests.test_attn_linear_transformer import quadratic_form

B, H, D = 2, 2, 8


def performer(seed=0, heads=H, dim=D, **opts):
  return ao.make(
    {'name': 'performer', **opts}, num_heads=heads, head_dim=dim, seed=seed
  )


def jit_out(core, pad, causal=False, **kw):
  """jit of (q, k, v) -> core output for a fixed mask."""
  return jax.jit(lambda q, k, v: core(q, k, v, Mask(pad, causal), **kw)[0])


@pytest.mark.parametrize('kernel', ['softmax', 'relu'])
@pytest.mark.parametrize('causal', [False, True])
@pytest.mark.parametrize('padded', [False, True])
def test_equals_quadratic_form(kernel, causal, padded):
  """Fixed features: out = phi(Q) phi(K)^T V / normaliser, computed densely."""
  length = 100  # two causal chunks of 64, the second padded inside the core
  core = performer(kernel=kernel, num_features=32)
  q, k, v = ao.qkv(seed=1, batch=B, length=length, heads=H, dim=D)
  pad = ao.padding([length, 61], length) if padded else None
  out = np.asarray(jit_out(core, pad, causal)(q, k, v))
  valid = jnp.ones((B, length), bool) if pad is None else pad
  phi_q, phi_k = core.feature_maps(q, k, valid)
  allowed = ao.allowed_mask(ao.full_pattern(length), pad, causal)
  ref = quadratic_form(phi_q, phi_k, v, allowed)
  real = np.asarray(valid)
  np.testing.assert_allclose(out[real], ref[real], atol=1e-5)
  assert np.isfinite(out).all()


@pytest.mark.slow
def test_approximates_softmax_better_with_more_features():
  """Error vs exact softmax falls 16 -> 1024 features; beats uniform."""
  length, heads, dim = 64, 8, 16
  q, k, v = ao.qkv(seed=7, batch=B, length=length, heads=heads, dim=dim)
  q, k = 0.4 * q, 0.4 * k
  pad = ao.padding([length, 40], length)
  real = np.asarray(pad)
  ref = ao.dense_reference(
    q, k, v, ao.allowed_mask(ao.full_pattern(length), pad)
  )
  errors = []
  for m in (16, 64, 256, 1024):
    core = performer(heads=heads, dim=dim, num_features=m)
    out = np.asarray(jit_out(core, pad)(q, k, v), np.float64)
    errors.append(np.abs(out - ref)[real].mean())
  v64 = np.asarray(v, np.float64)
  uniform = (v64 * real[:, :, None, None]).sum(1, keepdims=True) / real.sum(1)[
    :, None, None, None
  ]
  uniform_error = np.abs(uniform - ref)[real].mean()
  print(
    'performer mean |error| vs softmax at 16/64/256/1024 features:',
    ', '.join(f'{e:.4f}' for e in errors),
    f'; uniform attention: {uniform_error:.4f}',
  )
  assert all(a > b for a, b in zip(errors, errors[1:])), errors
  assert errors[-1] < 0.5 * uniform_error, (errors, uniform_error)


def test_features_from_seed_and_not_trainable():
  a, b, c = (performer(seed=s, num_features=32) for s in (0, 0, 1))
  np.testing.assert_array_equal(a.features[...], b.features[...])
  assert not np.allclose(a.features[...], c.features[...])
  assert a.features[...].shape == (H, 32, D)
  assert isinstance(a.features, RandomFeatures)
  assert not jax.tree.leaves(nnx.state(a, nnx.Param))
  assert len(jax.tree.leaves(nnx.state(a, RandomFeatures))) == 1


def test_orthogonal_blocks():
  dim, m = D, 32
  w = np.asarray(performer(dim=dim, num_features=m).features[...], np.float64)
  for block in (w[0, :dim], w[0, dim : 2 * dim], w[1, :dim]):
    gram = block @ block.T
    off = gram - np.diag(np.diag(gram))
    assert np.abs(off).max() < 1e-4 * np.diag(gram).max()
  norms = np.linalg.norm(w, axis=-1)
  assert norms.std() > 0.1  # chi-distributed, not all equal
  assert 0.5 * dim < np.mean(norms**2) < 1.5 * dim
  plain = np.asarray(
    performer(dim=dim, num_features=m, orthogonal=False).features[...]
  )
  gram = plain[0, :dim] @ plain[0, :dim].T
  assert np.abs(gram - np.diag(np.diag(gram))).max() > 0.1


def test_redraw_uses_the_call_key():
  length = 16
  q, k, v = ao.qkv(seed=2, batch=B, length=length, heads=H, dim=D)
  core = performer(redraw=True, num_features=32)
  stored = np.asarray(core.features[...])
  f = jax.jit(lambda key: core(q, k, v, Mask(None, False), rngs=key)[0])
  a, a2, b = f(jax.random.key(0)), f(jax.random.key(0)), f(jax.random.key(1))
  np.testing.assert_array_equal(a, a2)
  assert not np.allclose(a, b, atol=1e-3)
  np.testing.assert_array_equal(core.features[...], stored)
  # Without a key (evaluation) the stored features are used, as redraw=False.
  fixed = performer(num_features=32)
  np.testing.assert_allclose(
    ao.run(core, q, k, v), ao.run(fixed, q, k, v), atol=1e-6
  )
  # redraw=False ignores the call key.
  np.testing.assert_allclose(
    ao.run(fixed, q, k, v, rngs=jax.random.key(3)),
    ao.run(fixed, q, k, v),
    atol=1e-6,
  )


def test_causal_by_gradient():
  length = 100
  core = performer(num_features=32)
  q, k, v = ao.qkv(seed=3, batch=B, length=length, heads=H, dim=D)
  pad = ao.padding([length, 90], length)

  ts = (0, 10, 63, 64, 80)
  g_Tx3xL = ao.time_gradients(core, q, k, v, ts, pad)
  for g_3xL, t in zip(g_Tx3xL, ts):
    assert (g_3xL[:, t + 1 :] == 0).all(), t  # nothing after t
    assert (g_3xL[1:, : t + 1] > 0).all(), t  # every earlier key and value


@pytest.mark.parametrize('causal', [False, True])
def test_stabiliser_ignores_padding_and_stays_finite(causal):
  """Huge padded keys change nothing; large logits give no inf / NaN."""
  length = 24
  core = performer(num_features=32)
  q, k, v = ao.qkv(seed=4, batch=B, length=length, heads=H, dim=D, scale=3.0)
  pad = ao.padding([length, 11], length)
  f = jit_out(core, pad, causal)
  out = np.asarray(f(q, k, v))
  noise = 1e3 * jax.random.normal(jax.random.key(9), k.shape)
  hide = ~pad[:, :, None, None]
  out2 = np.asarray(f(q, jnp.where(hide, noise, k), jnp.where(hide, noise, v)))
  real = np.asarray(pad)
  np.testing.assert_allclose(out2[real], out[real], atol=1e-5)
  assert np.isfinite(out).all()
  grads = jax.jit(jax.grad(lambda *a: f(*a).sum(), (0, 1, 2)))(q, k, v)
  assert all(np.isfinite(np.asarray(g)).all() for g in grads)
  empty = np.asarray(
    jit_out(core, ao.padding([length, 0], length), causal)(q, k, v)
  )
  np.testing.assert_array_equal(empty[1], 0.0)


@pytest.mark.parametrize(
  'opts, match',
  [
    ({'kernel': 'cos'}, 'Unknown performer kernel'),
    ({'num_features': 0}, 'an integer >= 1'),
    ({'num_features': 2.5}, 'must be an integer'),
    ({'orthogonal': 'yes'}, 'true or false'),
    ({'redraw': 1}, 'true or false'),
  ],
)
def test_bad_options_are_user_errors(opts, match):
  with pytest.raises(UserError, match=match):
    performer(**opts)


@pytest.mark.parametrize('causal', [False, True])
def test_memory_grows_linearly(causal):
  opts = {'name': 'performer'}
  small = core_memory_bytes(opts, 1024, causal=causal)
  large = core_memory_bytes(opts, 4096, causal=causal)
  print(
    f'performer causal={causal}: {small} -> {large} bytes, '
    f'ratio {large / small:.2f}'
  )
  assert large / small <= 5


# The shared suite's settings for this core (tests/test_attention_suite.py).
SUITE = dict(
  opts={'num_features': 32},
  exact=None,
  identity='its kernel identities, this file',
  # Rotary (tests/test_positions.py): an estimate at many features, error
  # O(1 / sqrt(m)), inputs scaled down (its variance grows with |q| |k|).
  rotary_opts={'num_features': 2048},
  rotary_tol=0.05,
  rotary_scale=0.4,
)
