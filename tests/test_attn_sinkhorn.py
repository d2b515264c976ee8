"""Sparse Sinkhorn attention: the permutation, the block pattern, limits."""

from attention_oracle import (
  allowed_mask,
  dense_reference,
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
from models.attention.memory import core_memory_bytes
import models.attention.sinkhorn  # noqa: F401
from models.attention.sinkhorn import sinkhorn

B, L, H, D = 2, 37, 2, 8
LENGTHS = (L, 20)


def core(block_size=8, **opts):
  return make(
    {'name': 'sinkhorn', 'block_size': block_size, **opts},
    num_heads=H,
    head_dim=D,
    max_length=64,
  )


def sharpen(c, factor=4.0):
  """Scales the sorting network up so P is far from uniform."""
  c.sort_HxDxN[...] = factor * c.sort_HxDxN[...]
  c.sort_bias_HxN[...] = jax.random.normal(
    jax.random.key(5), c.sort_bias_HxN[...].shape
  )
  return c


def written_out(q, k, v, pad, p, block):
  """Each query block attends to its own block's real keys plus the sorted
  partner block (P from the core), as one dense softmax over 2 Lp keys."""
  q, k, v = (np.asarray(t, np.float64) for t in (q, k, v))
  p = np.asarray(p, np.float64)
  b, length, h, d = q.shape
  n = -(-length // block)
  lp = n * block
  real = np.zeros((b, lp), bool)
  real[:, :length] = np.asarray(pad)
  kz, vz = np.zeros((b, lp, h, d)), np.zeros((b, lp, h, d))
  kz[:, :length], vz[:, :length] = k, v
  kz[~real], vz[~real] = 0, 0
  kb, vb = (t.reshape(b, n, block, h, d) for t in (kz, vz))
  sk = np.einsum('bhij,bjchd->bichd', p, kb).reshape(b, lp, h, d)
  sv = np.einsum('bhij,bjchd->bichd', p, vb).reshape(b, lp, h, d)
  sreal = np.einsum('bhij,bjc->bhic', p, real.reshape(b, n, block)) > 0
  blk = np.arange(lp) // block
  own = blk[:length, None] == blk[None, :]  # [L, Lp]
  allowed_own = np.broadcast_to(
    own[None, None] & real[:, None, None, :], (b, h, length, lp)
  )
  allowed_sorted = own[None, None] & sreal.reshape(b, h, 1, lp)
  allowed = np.concatenate([allowed_own, allowed_sorted], -1)
  keys = np.concatenate([kz, sk], 1)
  values = np.concatenate([vz, sv], 1)
  return dense_reference(q, keys, values, allowed)


@pytest.mark.parametrize('block', [37, 64])
def test_one_block_is_exact_softmax(block):
  """b >= L: one block, its partner (itself) not added twice."""
  q, k, v = qkv(1, B, L, H, D)
  pad = padding(LENGTHS, L)
  want = dense_reference(q, k, v, allowed_mask(full_pattern(L), pad))
  got = run(core(block), q, k, v, pad)
  np.testing.assert_allclose(got, want, atol=2e-5)


@pytest.mark.parametrize('iters', [0, 10])
def test_equals_written_out_block_pattern(iters):
  c = sharpen(core(8, sinkhorn_iters=iters))
  q, k, v = qkv(2, B, L, H, D)
  pad = padding(LENGTHS, L)
  out, aux = c(q, k, v, Mask(pad, False))
  want = written_out(q, k, v, pad, aux['permutation'], 8)
  np.testing.assert_allclose(np.asarray(out), want, atol=2e-5)
  # Not a plain local pattern: the sorted block matters.
  local = dense_reference(
    q,
    k,
    v,
    allowed_mask(np.arange(L)[:, None] // 8 == np.arange(L)[None, :] // 8, pad),
  )
  assert np.abs(np.asarray(out) - local).max() > 1e-2


def test_permutation_is_doubly_stochastic_on_real_blocks():
  c = sharpen(core(8, sinkhorn_iters=30), 2.0)
  q, k, v = qkv(3, B, L, H, D)
  pad = padding(LENGTHS, L)
  p = np.asarray(c(q, k, v, Mask(pad, False))[1]['permutation'])
  assert p.shape == (B, H, 5, 5)
  for b, n_real in enumerate((5, 3)):  # 37 -> 5 blocks, 20 -> 3 real
    real = p[b, :, :n_real, :n_real]
    np.testing.assert_allclose(real.sum(-1), 1.0, atol=1e-3)
    np.testing.assert_allclose(real.sum(-2), 1.0, atol=1e-3)
    np.testing.assert_array_equal(p[b, :, n_real:], 0.0)
    np.testing.assert_array_equal(p[b, :, :, n_real:], 0.0)
  # Far from uniform: the test is not trivially met.
  assert p[0].max() > 0.5


def test_sinkhorn_function():
  x = jax.random.normal(jax.random.key(0), (64, 6, 6)) / 0.75
  valid = jnp.ones((6, 6), bool)
  p = np.asarray(sinkhorn(x, valid, 30))
  np.testing.assert_allclose(p.sum(-1), 1.0, atol=1e-3)
  np.testing.assert_allclose(p.sum(-2), 1.0, atol=1e-5)
  # Default 10 iterations: columns exact (normalised last), rows close.
  p = np.asarray(sinkhorn(x / 4, valid, 10))
  np.testing.assert_allclose(p.sum(-1), 1.0, atol=1e-3)
  # 0 iterations: a row softmax.
  p0 = np.asarray(sinkhorn(x, valid, 0))
  np.testing.assert_allclose(p0, jax.nn.softmax(x, -1), atol=1e-6)
  assert np.abs(p0.sum(-2) - 1).max() > 0.1
  # Masked entries get no mass, fully masked rows and columns are zero.
  valid = np.logical_and.outer(np.arange(6) < 4, np.arange(6) < 4)
  valid[0, 3] = False
  p = np.asarray(sinkhorn(x, jnp.asarray(valid), 30))
  assert np.isfinite(p).all()
  np.testing.assert_array_equal(p[:, ~valid], 0.0)
  np.testing.assert_allclose(p[:, :4, :4].sum(-1), 1.0, atol=1e-3)
  np.testing.assert_allclose(p[:, :4, :4].sum(-2), 1.0, atol=1e-3)
  g = jax.grad(lambda x: sinkhorn(x, valid, 10)[..., 0].sum())(x)
  assert np.isfinite(np.asarray(g)).all()


def test_padding_invariance_and_padded_rows():
  c = sharpen(core(8))
  q, k, v = qkv(4, B, L, H, D)
  for lengths in (LENGTHS, (L, 0), (3, 9)):
    pad = padding(lengths, L)
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
    assert np.isfinite(out1).all() and np.isfinite(out2).all()
    np.testing.assert_allclose(out1[real], out2[real], atol=1e-5)
    if lengths[1] == 0:
      np.testing.assert_array_equal(out1[1], 0.0)


def test_gradients_finite_and_reach_the_sorting_network():
  c = core(8)
  q, k, v = qkv(5, B, L, H, D)
  pad = padding((L, 0), L)
  graphdef, params, rest = nnx.split(c, nnx.Param, ...)

  def loss(params, q, k, v):
    m = nnx.merge(graphdef, params, rest)
    return jnp.sum(m(q, k, v, Mask(pad, False))[0] ** 2)

  grads = jax.grad(loss, argnums=(0, 1, 2, 3))(params, q, k, v)
  for g in jax.tree.leaves(grads):
    assert np.isfinite(np.asarray(g)).all()
  g_sort = np.asarray(grads[0]['sort_HxDxN'][...])
  assert np.abs(g_sort).sum() > 0


def test_cls_length_and_one_real_block():
  """L = 2^k + 1 (CLS) works; a single real block among padding."""
  q, k, v = qkv(6, B, 65, H, D)
  pad = padding((65, 5), 65)
  c = make(
    {'name': 'sinkhorn', 'block_size': 16},
    num_heads=H,
    head_dim=D,
    max_length=65,
  )
  out = run(c, q, k, v, pad)
  assert out.shape == (B, 65, H, D) and np.isfinite(out).all()


def test_refuses_causal_and_bad_options():
  q, k, v = qkv(7, B, L, H, D)
  with pytest.raises(UserError, match="'sinkhorn' cannot be causal"):
    core(8)(q, k, v, Mask(None, True))
  with pytest.raises(UserError, match='max_length'):
    make({'name': 'sinkhorn', 'block_size': 8}, max_length=16)(
      q, k, v, Mask(None, False)
    )
  for opts, word in (
    ({'block_size': 0}, 'block_size'),
    ({'sinkhorn_iters': -1}, 'sinkhorn_iters'),
    ({'temperature': 0.0}, 'temperature'),
  ):
    with pytest.raises(UserError, match=word):
      make({'name': 'sinkhorn', **opts})


def test_memory_grows_about_linearly():
  small = core_memory_bytes({'name': 'sinkhorn'}, 1024)
  large = core_memory_bytes({'name': 'sinkhorn'}, 4096)
  assert large / small <= 5, (small, large)


# The shared suite's settings for this core (tests/test_attention_suite.py).
SUITE = dict(
  opts={'block_size': 8},
  exact={'block_size': 64},
  exact_causal=False,
  causal=None,
)
