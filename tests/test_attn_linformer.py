"""Linformer: exact limit, the projection written out, options, refusals."""

import attention_oracle as oracle
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lra.errors import UserError
from models.attention import Mask
import models.attention.linformer  # noqa: F401
from models.attention.memory import core_memory_bytes

B, H, D = 2, 2, 8
SHARING = [(False, True), (True, True), (False, False), (True, False)]


def make(length=24, proj_length=None, share_kv=False, share_heads=True, **kw):
  return oracle.make(
    {
      'name': 'linformer',
      'proj_length': length if proj_length is None else proj_length,
      'share_kv': share_kv,
      'share_heads': share_heads,
    },
    num_heads=H,
    head_dim=D,
    max_length=length,
    **kw,
  )


@nnx.jit
def _run(core, q, k, v, pad, key):
  return core(q, k, v, Mask(pad, False), rngs=key)[0]


def run(core, q, k, v, pad=None, rngs=None):
  """The core's output as float64 numpy, one compiled program per shape."""
  return np.asarray(_run(core, q, k, v, pad, rngs), np.float64)


def set_identity(core, length):
  eye = jnp.eye(length)
  if not core.share_heads:
    eye = jnp.broadcast_to(eye, (H, length, length))
  core.e_MxK[...] = eye
  if core.f_MxK is not None:
    core.f_MxK[...] = eye


def projection_reference(q, k, v, e, f, pad):
  """K' = E^T (k * real), V' = F^T (v * real), softmax over K' (float64)."""
  q, k, v, e, f = (np.asarray(t, np.float64) for t in (q, k, v, e, f))
  length = k.shape[1]
  if e.ndim == 2:
    e, f = (np.broadcast_to(t, (H,) + t.shape) for t in (e, f))
  real = np.asarray(pad, np.float64)[:, :, None, None]
  kp = np.einsum('bmhd,hmk->bkhd', k * real, e[:, :length])
  vp = np.einsum('bmhd,hmk->bkhd', v * real, f[:, :length])
  return oracle.dense_reference(q, kp, vp, np.ones((1, 1, 1, 1), bool))


@pytest.mark.parametrize('share_kv,share_heads', SHARING)
def test_identity_projection_is_softmax_attention(share_kv, share_heads):
  """The exact limit: k = L = max_length, E = F = I, no padding."""
  length = 24
  core = make(length, share_kv=share_kv, share_heads=share_heads)
  set_identity(core, length)
  q, k, v = oracle.qkv(0, B, length, H, D)
  ref = oracle.dense_reference(q, k, v, oracle.full_pattern(length))
  np.testing.assert_allclose(run(core, q, k, v), ref, atol=1e-5)


def test_identity_projection_with_padding_sees_zeroed_padded_slots():
  """With padding, the identity limit keeps zero keys/values (logit 0)."""
  length = 24
  core = make(length)
  set_identity(core, length)
  q, k, v = oracle.qkv(1, B, length, H, D)
  pad = oracle.padding([length, 9], length)
  real = pad[:, :, None, None]
  zeroed = oracle.dense_reference(
    q, jnp.where(real, k, 0), jnp.where(real, v, 0), True
  )
  out = run(core, q, k, v, pad)
  np.testing.assert_allclose(out, zeroed, atol=1e-5)
  # Hence not masked softmax, which drops the 15 padded slots entirely.
  masked = oracle.dense_reference(q, k, v, oracle.allowed_mask(True, pad))
  assert np.abs(out[1] - masked[1]).max() > 1e-2
  np.testing.assert_allclose(out[0], masked[0], atol=1e-5)


@pytest.mark.parametrize('share_kv,share_heads', SHARING)
def test_matches_written_out_projection(share_kv, share_heads):
  """Learned E, F (as initialised), k < L < max_length, padded."""
  length = 20
  core = make(32, 8, share_kv=share_kv, share_heads=share_heads, seed=3)
  q, k, v = oracle.qkv(2, B, length, H, D)
  pad = oracle.padding([length, 13], length)
  e = core.e_MxK[...]
  f = e if core.f_MxK is None else core.f_MxK[...]
  ref = projection_reference(q, k, v, e, f, pad)
  np.testing.assert_allclose(run(core, q, k, v, pad), ref, atol=1e-5)


def test_options_shape_the_parameters():
  core = make(32, 8)
  assert core.e_MxK[...].shape == (32, 8) and core.f_MxK[...].shape == (32, 8)
  assert not np.allclose(core.e_MxK[...], core.f_MxK[...])
  shared = make(32, 8, share_kv=True)
  assert shared.f_MxK is None
  per_head = make(32, 8, share_heads=False)
  assert per_head.e_MxK[...].shape == (H, 32, 8)
  assert not np.allclose(per_head.e_MxK[...][0], per_head.e_MxK[...][1])
  counts = [
    sum(x.size for x in jax.tree.leaves(nnx.state(c, nnx.Param)))
    for c in (core, shared, per_head)
  ]
  assert counts == [2 * 32 * 8, 32 * 8, 2 * H * 32 * 8]
  # LeCun normal over the length axis: variance 1 / max_length.
  big = make(256, 256)
  assert abs(float(jnp.std(big.e_MxK[...])) * 16 - 1) < 0.05


def test_padding_invariance_and_empty_example():
  length = 20
  core = make(32, 8)
  q, k, v = oracle.qkv(4, B, length, H, D)
  pad = oracle.padding([11, 0], length)
  noise = 100 * jax.random.normal(jax.random.key(9), k.shape)
  hide = ~pad[:, :, None, None]
  out1 = run(core, q, k, v, pad)
  out2 = run(
    core, q, jnp.where(hide, noise, k), jnp.where(hide, -noise, v), pad
  )
  np.testing.assert_allclose(out1[0, :11], out2[0, :11], atol=1e-5)
  np.testing.assert_array_equal(out1[1], 0.0)  # no real key at all

  def loss(q, k, v):
    return core(q, k, v, Mask(pad, False))[0].sum()

  grads = jax.grad(loss, argnums=(0, 1, 2))(q, k, v)
  assert all(np.isfinite(np.asarray(g)).all() for g in grads)


def test_projections_are_learned():
  core = make(32, 8)
  q, k, v = oracle.qkv(5, B, 20, H, D)

  def loss(core):
    return (core(q, k, v, Mask(None, False))[0] ** 2).sum()

  grads = nnx.grad(loss)(core)
  assert np.abs(np.asarray(grads.e_MxK[...])).sum() > 0
  assert np.abs(np.asarray(grads.f_MxK[...])).sum() > 0
  # Rows past the input length get no gradient (the slice).
  np.testing.assert_array_equal(np.asarray(grads.e_MxK[...])[20:], 0.0)


def test_refusals_are_one_sentence():
  core = make(16, 4)
  q, k, v = oracle.qkv(6, B, 16, H, D)
  with pytest.raises(UserError, match="'linformer' cannot be causal"):
    core(q, k, v, Mask(None, True))
  q, k, v = oracle.qkv(6, B, 17, H, D)
  with pytest.raises(UserError, match='length 17 .* max_length 16'):
    core(q, k, v, Mask(None, False))
  with pytest.raises(UserError, match='proj_length must be an integer >= 1'):
    make(16, 0)
  with pytest.raises(UserError, match='share_kv must be true or false'):
    make(16, 4, share_kv='yes')


def test_attention_dropout_uses_key():
  core = make(32, 8, dropout_rate=0.5)
  q, k, v = oracle.qkv(7, B, 20, H, D)
  a = run(core, q, k, v, rngs=jax.random.key(0))
  b = run(core, q, k, v, rngs=jax.random.key(0))
  c = run(core, q, k, v, rngs=jax.random.key(1))
  d = run(core, q, k, v)
  np.testing.assert_array_equal(a, b)
  assert not np.allclose(a, c)
  np.testing.assert_allclose(d, run(make(32, 8), q, k, v), atol=1e-6)


def test_bfloat16_runs_with_float32_softmax():
  core = make(32, 8, dtype=jnp.bfloat16)
  q, k, v = oracle.qkv(8, B, 20, H, D)
  pad = oracle.padding([20, 7], 20)
  out, _ = core(*(t.astype(jnp.bfloat16) for t in (q, k, v)), Mask(pad))
  assert out.dtype == jnp.bfloat16
  ref = run(make(32, 8), q, k, v, pad)
  np.testing.assert_allclose(np.asarray(out, np.float32), ref, atol=0.1)


def test_memory_grows_linearly():
  small = core_memory_bytes({'name': 'linformer'}, 1024)
  large = core_memory_bytes({'name': 'linformer'}, 4096)
  assert large / small <= 5, (small, large)


# The shared suite's settings for this core (tests/test_attention_suite.py).
def _identity_projections(core):
  """Linformer's exact limit: k = L and E = F = identity."""
  for name in ('e_MxK', 'f_MxK'):
    p = getattr(core, name, None)
    if p is not None:
      p[...] = jnp.eye(*p[...].shape[-2:]).reshape(p[...].shape)


SUITE = dict(
  opts={'proj_length': 16},
  exact={'proj_length': 37},
  hook=_identity_projections,
  exact_padding=False,
  causal=None,
)


@pytest.mark.parametrize('share_kv', [False, True])
def test_the_layer_projects_inputs_before_their_weights(share_kv):
  """MultiHeadAttention with a head-shared Linformer projects x along
  length first ((E^T x) W): the same output and gradients as the core on
  the projected keys and values (E^T (x W)), padding included, and the
  reordered path is the one taken (the core sees k rows, not L)."""
  from models.layers import MultiHeadAttention  # pylint: disable=g-import-not-at-top

  length, emb, k_slots = 24, 16, 8
  attention = {
    'name': 'linformer',
    'proj_length': k_slots,
    'share_kv': share_kv,
  }
  layer = MultiHeadAttention(
    emb,
    H * D,
    H,
    attention,
    max_length=length,
    dropout_rate=0.0,
    dtype=jnp.float32,
    rngs=nnx.Rngs(0),
  )
  x = jax.random.normal(jax.random.key(1), (B, length, emb))
  pad = jnp.arange(length)[None, :] < jnp.array([[length], [15]])
  mask = Mask(pad, False)

  def reference(layer, x):  # the keys' and values' L rows projected
    heads = lambda t: t.reshape(B, length, H, D)  # noqa: E731
    q, k, v = (heads(p(x)) for p in (layer.query, layer.key, layer.value))
    out = layer.core(q, k, v, mask)[0]
    return layer.out(out.reshape(B, length, -1))

  seen = []
  call = type(layer.core).__call__

  def spy(self, q, k, v, *args, **kw):
    seen.append(k.shape[1])
    return call(self, q, k, v, *args, **kw)

  type(layer.core).__call__ = spy
  try:
    ours = layer(x, mask)[0]
  finally:
    type(layer.core).__call__ = call
  assert seen == [k_slots]
  np.testing.assert_allclose(ours, reference(layer, x), rtol=1e-5, atol=1e-5)
  loss = lambda f: lambda m, x: jnp.sum(jnp.sin(f(m, x)))  # noqa: E731
  g_ours = nnx.grad(loss(lambda m, x: m(x, mask)[0]), argnums=(0, 1))(layer, x)
  g_ref = nnx.grad(loss(reference), argnums=(0, 1))(layer, x)
  for a, b in zip(jax.tree.leaves(g_ours), jax.tree.leaves(g_ref)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
