"""Local attention: contiguous blocks against the dense oracle."""

import attention_oracle as oracle
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lra.errors import UserError
from models.attention.base import attend
from models.attention.local import attend_flat
from models.attention.memory import core_memory_bytes

H, D = 2, 8


run = oracle.run
depends_on_future = oracle.depends_on_future


def block_pattern(length, b):
  i = np.arange(length)
  return (i[:, None] // b) == (i[None, :] // b)


@pytest.mark.parametrize('length', [37, 64, 100])
@pytest.mark.parametrize('causal', [False, True])
def test_matches_dense_block_pattern(length, causal):
  b = 16
  core = oracle.make(
    {'name': 'local', 'block_size': b}, num_heads=H, head_dim=D
  )
  q, k, v = oracle.qkv(seed=length, length=length, heads=H, dim=D)
  pad = oracle.padding([length, length - 9], length)
  out = run(core, q, k, v, pad, causal)
  allowed = oracle.allowed_mask(block_pattern(length, b), pad, causal)
  np.testing.assert_allclose(
    out, oracle.dense_reference(q, k, v, allowed), atol=1e-5
  )


def test_blocks_are_contiguous_not_strided():
  """Output at 0 depends on key 1 (same block), not on key L / b."""
  length, b = 32, 8
  core = oracle.make({'name': 'local', 'block_size': b}, num_heads=H)
  q, k, v = oracle.qkv(seed=1, length=length, heads=H, dim=D)
  grad = jax.jit(
    jax.grad(lambda v: core(q, k, v, oracle.Mask())[0][:, 0].sum())
  )(v)
  grad = np.abs(np.asarray(grad)).sum(axis=(0, 2, 3))
  assert grad[1] > 0 and grad[b - 1] > 0
  assert grad[b:].sum() == 0


@pytest.mark.parametrize('causal', [False, True])
def test_block_covering_sequence_is_softmax(causal):
  length = 37
  q, k, v = oracle.qkv(seed=3, length=length, heads=H, dim=D)
  pad = oracle.padding([length, 20], length)
  outs = [
    run(oracle.make(opts, num_heads=H, head_dim=D), q, k, v, pad, causal)
    for opts in (
      {'name': 'local', 'block_size': length},
      {'name': 'local', 'block_size': 64},
      {'name': 'softmax'},
    )
  ]
  np.testing.assert_allclose(outs[0], outs[2], atol=1e-5)
  np.testing.assert_allclose(outs[1], outs[2], atol=1e-5)


def test_causal_by_gradient():
  length = 40
  core = oracle.make({'name': 'local', 'block_size': 16}, num_heads=H)
  q, k, v = oracle.qkv(seed=4, length=length, heads=H, dim=D)
  pad = oracle.padding([length, 30], length)
  assert not depends_on_future(core, q, k, v, 20, pad)
  assert not depends_on_future(core, q, k, v, 17, pad)


def test_dropout_changes_weights_and_is_keyed():
  core = oracle.make(
    {'name': 'local', 'block_size': 8}, num_heads=H, dropout_rate=0.5
  )
  q, k, v = oracle.qkv(seed=5, length=24, heads=H, dim=D)
  f = jax.jit(lambda key: core(q, k, v, oracle.Mask(), rngs=key)[0])
  a, b, c = (np.asarray(f(jax.random.key(s))) for s in (1, 1, 2))
  plain = run(core, q, k, v)
  assert np.abs(a - plain).max() > 1e-3
  assert np.abs(a - c).max() > 1e-3
  np.testing.assert_array_equal(a, b)


def test_no_quadratic_intermediate():
  length = 1024
  core = oracle.make({'name': 'local'}, num_heads=1)
  q = jax.ShapeDtypeStruct((1, length, 1, D), jnp.float32)
  pad = jax.ShapeDtypeStruct((1, length), bool)
  jaxpr = jax.make_jaxpr(
    lambda q, k, v, pad: core(q, k, v, oracle.Mask(pad, True))
  )(q, q, q, pad)
  sizes = [
    np.prod(var.aval.shape)
    for eqn in jaxpr.eqns
    for var in eqn.outvars
    if hasattr(var.aval, 'shape')
  ]
  assert max(sizes) <= length * 64, max(sizes)


def test_bfloat16_output_dtype():
  core = oracle.make(
    {'name': 'local', 'block_size': 8}, num_heads=H, dtype=jnp.bfloat16
  )
  q, k, v = (
    t.astype(jnp.bfloat16)
    for t in oracle.qkv(seed=6, length=20, heads=H, dim=D)
  )
  out = jax.jit(lambda q, k, v, pad: core(q, k, v, oracle.Mask(pad))[0])(
    q, k, v, oracle.padding([20, 3], 20)
  )
  assert out.dtype == jnp.bfloat16
  assert np.isfinite(np.asarray(out, np.float32)).all()


@pytest.mark.parametrize('block_size', [0, -3, 2.5])
def test_bad_block_size_is_user_error(block_size):
  with pytest.raises(UserError, match='block_size'):
    oracle.make({'name': 'local', 'block_size': block_size})


def test_memory_grows_linearly():
  small = core_memory_bytes({'name': 'local'}, 1024)
  large = core_memory_bytes({'name': 'local'}, 4096)
  assert large / small <= 5, (small, large)


@pytest.mark.parametrize('rate', [0.0, 0.25])
def test_attend_flat_equals_attend(rate):
  """The merged-batch products (issue #35) change no value, gradient or
  dropout mask of base.attend."""
  shape = (2, 3, H, 5, D)  # [B, N, H, C, D]
  q, k, v = (
    jax.random.normal(key, shape)
    for key in jax.random.split(jax.random.key(0), 3)
  )
  allowed = jnp.tril(jnp.ones((5, 5), bool)) & (
    jnp.arange(3)[None, :, None, None, None]
    < jnp.array([3, 2])[:, None, None, None, None]
  )
  key = jax.random.key(1) if rate else None

  def loss(fn):
    def f(q, k, v):
      out = fn(q, k, v, allowed, scale=D**-0.5, rate=rate, key=key)
      return jnp.sum(out * jnp.arange(D)), out

    return jax.value_and_grad(f, argnums=(0, 1, 2), has_aux=True)(q, k, v)

  (_, out_a), grads_a = loss(attend)
  (_, out_b), grads_b = loss(attend_flat)
  np.testing.assert_allclose(out_b, out_a, atol=1e-6)
  for a, b in zip(grads_a, grads_b, strict=True):
    np.testing.assert_allclose(b, a, atol=1e-5)


# The shared suite's settings for this core (tests/test_attention_suite.py).
SUITE = dict(opts={'block_size': 8}, exact={'block_size': 64})
