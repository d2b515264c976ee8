"""Longformer: window/dilation/global pattern against the dense oracle."""

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lra.errors import UserError
from models.attention import Mask
import models.attention.longformer  # noqa: F401
from models.attention.memory import core_memory_bytes
from tests.attention_oracle import (
  allowed_mask,
  dense_reference,
  full_pattern,
  make,
  padding,
  qkv,
)

H, D = 2, 8


def longformer(**opts):
  opts.setdefault('global_projections', False)
  return make({'name': 'longformer', **opts}, num_heads=H, head_dim=D)


def jitted(core, causal=False):
  """(q, k, v, pad, key) -> core(...)[0], jitted (much faster than eager)."""
  f = jax.jit(lambda *a: core(*a[:3], Mask(a[3], causal), rngs=a[4])[0])
  return lambda q, k, v, pad=None, key=None: np.asarray(
    f(q, k, v, pad, key), np.float64
  )


def call(core, q, k, v, pad=None, causal=False, key=None):
  return jitted(core, causal)(q, k, v, pad, key)


def pattern(length, window, dilation, g):
  """bool[L, L]: the Longformer pattern written out from its definition."""
  i = np.arange(length)[:, None]
  j = np.arange(length)[None, :]
  band = (np.abs(i - j) <= (window // 2) * dilation) & ((i - j) % dilation == 0)
  return band | (j < g) | (i < g)


CASES = [
  # (L, window, dilation, global_tokens, causal)
  (length, window, dilation, g, causal)
  for length in (37, 64, 100)
  for window, dilation in ((6, 1), (8, 2))
  for g, causal in ((0, False), (0, True), (2, False))
] + [
  (37, 30, 1, 2, False),  # window not covering L, one block per class
  (64, 20, 3, 1, False),  # dilation 3, L not a multiple of d
  (100, 16, 1, 0, True),
]


@pytest.mark.parametrize('length,window,dilation,g,causal', CASES)
def test_matches_dense_pattern(length, window, dilation, g, causal):
  q, k, v = qkv(seed=length + dilation, length=length, heads=H, dim=D)
  pad = padding([length, length - 15], length)
  core = longformer(window=window, dilation=dilation, global_tokens=g)
  out = call(core, q, k, v, pad, causal)
  allowed = allowed_mask(pattern(length, window, dilation, g), pad, causal)
  np.testing.assert_allclose(out, dense_reference(q, k, v, allowed), atol=1e-5)


@pytest.mark.parametrize(
  'g,causal', [(0, False), (0, True), (1, False), (3, False)]
)
def test_wide_window_equals_softmax(g, causal):
  length = 45
  q, k, v = qkv(seed=7, length=length, heads=H, dim=D)
  pad = padding([length, 30], length)
  core = longformer(window=2 * length, global_tokens=g)
  out = call(core, q, k, v, pad, causal)
  allowed = allowed_mask(full_pattern(length), pad, causal)
  np.testing.assert_allclose(out, dense_reference(q, k, v, allowed), atol=1e-5)


def test_default_options_short_input_is_softmax():
  """Default window 512 (with the default global token) covers L = 100."""
  length = 100
  q, k, v = qkv(seed=8, length=length, heads=H, dim=D)
  pad = padding([length, 61], length)
  core = make({'name': 'longformer'}, num_heads=H, head_dim=D)
  out = call(core, q, k, v, pad)
  allowed = allowed_mask(full_pattern(length), pad)
  np.testing.assert_allclose(out, dense_reference(q, k, v, allowed), atol=1e-5)


def test_global_projections_drive_global_rows_only():
  length, g, window = 40, 2, 6
  q, k, v = qkv(seed=9, length=length, heads=H, dim=D)
  pad = padding([length, 33], length)
  plain = longformer(window=window, global_tokens=g)
  core = longformer(window=window, global_tokens=g, global_projections=True)
  assert not nnx.state(plain, nnx.Param)  # no parameters when false
  # Identity maps at initialisation: the same output as without.
  base = call(plain, q, k, v, pad)
  np.testing.assert_allclose(call(core, q, k, v, pad), base, atol=1e-6)

  keys = jax.random.split(jax.random.key(3), 6)
  maps = {}
  for i, name in enumerate('qkv'):
    w = jnp.eye(D) + 0.5 * jax.random.normal(keys[i], (H, D, D))
    c = 0.3 * jax.random.normal(keys[i + 3], (H, D))
    getattr(core, f'global_{name}_HxDxD')[...] = w
    getattr(core, f'global_{name}_bias_HxD')[...] = c
    maps[name] = (w, c)
  out = call(core, q, k, v, pad)
  # Non-global rows keep the ordinary q, k, v (also for the global keys).
  np.testing.assert_allclose(out[:, g:], base[:, g:], atol=1e-6)
  assert np.abs(out[:, :g] - base[:, :g]).max() > 1e-2
  # Global rows: softmax over all keys with the mapped q, k, v.
  mq, mk, mv = (
    jnp.einsum('blhd,hde->blhe', t, maps[n][0]) + maps[n][1]
    for t, n in ((q, 'q'), (k, 'k'), (v, 'v'))
  )
  ref = dense_reference(mq, mk, mv, allowed_mask(full_pattern(length), pad))
  np.testing.assert_allclose(out[:, :g], ref[:, :g], atol=1e-5)

  # The maps receive gradients (they are trained).
  graphdef, params, rest = nnx.split(core, nnx.Param, ...)

  def loss(params):
    module = nnx.merge(graphdef, params, rest)
    return module(q, k, v, Mask(pad, False))[0].sum()

  grads = jax.tree.leaves(jax.jit(jax.grad(loss))(params))
  assert len(grads) == 6
  assert all(np.abs(np.asarray(t)).max() > 0 for t in grads)


def test_no_parameters_without_global_tokens():
  core = longformer(window=8, global_tokens=0, global_projections=True)
  assert not nnx.state(core, nnx.Param)


def test_causal_refused_with_global_tokens():
  q, k, v = qkv(length=16, heads=H, dim=D)
  core = longformer(window=4, global_tokens=1)
  with pytest.raises(UserError, match="'longformer' cannot be causal"):
    core(q, k, v, Mask(None, True))


def test_causal_by_gradient():
  length, t = 40, 21
  q, k, v = qkv(seed=11, length=length, heads=H, dim=D)
  core = longformer(window=8, dilation=2, global_tokens=0)

  def f(q, k, v):
    return core(q, k, v, Mask(None, True))[0][:, t].sum()

  grads = jax.jit(jax.grad(f, argnums=(0, 1, 2)))(q, k, v)
  for grad in grads:  # nothing after t
    assert np.abs(np.asarray(grad)[:, t + 1 :]).sum() == 0
  # The window reaches back 4 dilated steps.
  seen = np.abs(np.asarray(grads[1])).sum(axis=(0, 2, 3)) > 0
  np.testing.assert_array_equal(
    np.flatnonzero(seen), [t - 8, t - 6, t - 4, t - 2, t]
  )


@pytest.mark.parametrize(
  'opts',
  [
    {'window': 7},
    {'window': 0},
    {'window': 8.0},
    {'dilation': 0},
    {'global_tokens': -1},
    {'global_projections': 'yes'},
  ],
)
def test_bad_options_name_the_problem(opts):
  name = next(iter(opts))
  with pytest.raises(UserError, match=f'ongformer {name} must'):
    longformer(**opts)


def test_attention_dropout_uses_key():
  q, k, v = qkv(seed=12, length=33, heads=H, dim=D)
  core = make(
    {'name': 'longformer', 'window': 6, 'global_tokens': 2},
    num_heads=H,
    head_dim=D,
    dropout_rate=0.5,
  )
  pad = padding([33, 20], 33)
  f = jitted(core)
  a = f(q, k, v, pad, jax.random.key(0))
  b = f(q, k, v, pad, jax.random.key(0))
  c = f(q, k, v, pad, jax.random.key(1))
  d = f(q, k, v, pad)
  np.testing.assert_array_equal(a, b)
  assert not np.allclose(a[:, :2], c[:, :2])  # global rows
  assert not np.allclose(a[:, 2:], c[:, 2:])  # window rows
  assert np.isfinite(np.asarray(a)).all()
  assert not np.allclose(a, d)


def test_memory_grows_linearly():
  opts = {'name': 'longformer', 'window': 128}
  small = core_memory_bytes(opts, 1024)
  large = core_memory_bytes(opts, 4096)
  assert large / small <= 5, (small, large)
