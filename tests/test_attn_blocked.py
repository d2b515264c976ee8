"""Blocked softmax attention (models/attention/blocked.py) against the einsum
core: outputs and gradients, masks, ragged blocks, bfloat16, memory."""

import functools

import attention_oracle as oracle
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lra.errors import UserError
from models.attention.blocked import blocked_attention
from models.attention.memory import core_memory_bytes

H, D = 2, 8
EINSUM = oracle.make({'name': 'softmax'}, num_heads=H, head_dim=D)


@functools.partial(jax.jit, static_argnames=('causal', 'block_q', 'block_k'))
def blocked_vjp(q, k, v, pad, g, *, causal, block_q, block_k):
  """(out, (dq, dk, dv)) of the blocked path for the cotangent g."""
  f = functools.partial(
    blocked_attention, causal=causal, block_q=block_q, block_k=block_k
  )
  out, pull = jax.vjp(lambda q, k, v: f(q, k, v, pad), q, k, v)
  return out, pull(g.astype(out.dtype))


@functools.partial(jax.jit, static_argnames=('causal',))
def einsum_vjp(q, k, v, pad, g, *, causal):
  """(out, (dq, dk, dv)) of the einsum core (the reference)."""
  f = lambda q, k, v: EINSUM(q, k, v, oracle.Mask(pad, causal))[0]
  out, pull = jax.vjp(f, q, k, v)
  return out, pull(g.astype(out.dtype))


def inputs(seed, length, m, lengths=None, dtype=jnp.float32):
  ks = jax.random.split(jax.random.key(seed), 4)
  q = jax.random.normal(ks[0], (2, length, H, D))
  k = jax.random.normal(ks[1], (2, m, H, D))
  v = jax.random.normal(ks[2], (2, m, H, D))
  g = jax.random.normal(ks[3], (2, length, H, D))
  pad = None if lengths is None else oracle.padding(lengths, m)
  return [t.astype(dtype) for t in (q, k, v)] + [pad, g]


def as_np(x):
  return np.asarray(x, np.float64)


CASES = {
  # name: (L, M, key lengths or None, causal, block_q, block_k); a key
  # length of 0 is a fully padded example.
  'no_mask': (32, 32, None, False, 8, 16),
  'causal': (32, 32, None, True, 8, 8),
  'padding_cross_lengths': (24, 40, [33, 0], False, 8, 16),
  'ragged_blocks': (37, 37, None, False, 16, 8),
  'ragged_causal_padding_cross_lengths': (37, 29, [21, 0], True, 8, 16),
}
RAGGED = 'ragged_causal_padding_cross_lengths'


@pytest.mark.parametrize('name', list(CASES))
def test_matches_einsum_core(name):
  length, m, lengths, causal, bq, bk = CASES[name]
  q, k, v, pad, g = inputs(len(name), length, m, lengths)
  out, grads = blocked_vjp(
    q, k, v, pad, g, causal=causal, block_q=bq, block_k=bk
  )
  ref_out, ref_grads = einsum_vjp(q, k, v, pad, g, causal=causal)
  np.testing.assert_allclose(as_np(out), as_np(ref_out), atol=2e-6)
  for got, want, what in zip(grads, ref_grads, 'qkv', strict=True):
    np.testing.assert_allclose(
      as_np(got), as_np(want), atol=1e-5, err_msg=f'd{what}'
    )
  if lengths is not None and 0 in lengths:
    empty = lengths.index(0)
    np.testing.assert_array_equal(as_np(out)[empty], 0.0)
    for grad in grads:
      assert np.isfinite(as_np(grad)).all()
      np.testing.assert_array_equal(as_np(grad)[empty], 0.0)


def test_bfloat16_inputs():
  length, m, lengths, causal, bq, bk = CASES[RAGGED]
  q, k, v, pad, g = inputs(len(RAGGED), length, m, lengths, jnp.bfloat16)
  out, grads = blocked_vjp(
    q, k, v, pad, g, causal=causal, block_q=bq, block_k=bk
  )
  assert out.dtype == jnp.bfloat16
  assert all(grad.dtype == jnp.bfloat16 for grad in grads)
  # The float32 einsum core on the same (bfloat16-rounded) values: the
  # blocked path computes in float32 and rounds only its results.
  f32 = [t.astype(jnp.float32) for t in (q, k, v)]
  ref_out, ref_grads = einsum_vjp(*f32, pad, g, causal=causal)
  np.testing.assert_allclose(as_np(out), as_np(ref_out), atol=2e-2, rtol=1e-2)
  for got, want in zip(grads, ref_grads, strict=True):
    np.testing.assert_allclose(as_np(got), as_np(want), atol=5e-2, rtol=2e-2)


def test_causal_skips_blocks_above_the_diagonal():
  """Key blocks wholly in a query block's future are never read: NaN values
  there reach no output of that block (the einsum core's 0 * NaN would),
  and NaN cotangents of earlier query blocks reach no later key block."""
  length, m, _, causal, b, bk = CASES['causal']
  assert causal and b == bk and length == m == 4 * b
  q, k, v, _, g = inputs(len('causal'), length, m)
  run = functools.partial(blocked_vjp, causal=True, block_q=b, block_k=b)
  position = jnp.arange(length)[None, :, None, None]
  out = as_np(run(q, k, jnp.where(position >= b, jnp.nan, v), None, g)[0])
  assert np.isfinite(out[:, :b]).all()
  np.testing.assert_allclose(
    out[:, :b], as_np(run(q, k, v, None, g)[0])[:, :b], atol=1e-6
  )
  _, (_, dk, dv) = run(q, k, v, None, jnp.where(position < 3 * b, jnp.nan, g))
  for grad in (dk, dv):
    assert np.isfinite(as_np(grad)[:, 3 * b :]).all()


@pytest.mark.parametrize('implementation', ['blocked', 'fused'])
def test_core_paths_match_einsum(implementation):
  """The softmax core's 'blocked' path, and 'fused' on CPU (no fused kernel
  here: the blocked path), equal the einsum path (one block: L and M are
  below the default block sizes)."""
  core = oracle.make(
    {'name': 'softmax', 'implementation': implementation},
    num_heads=H,
    head_dim=D,
  )
  length, m, lengths, causal, _, _ = CASES[RAGGED]
  q, k, v, pad, g = inputs(len(RAGGED), length, m, lengths)
  out = jax.jit(lambda q, k, v, pad: core(q, k, v, oracle.Mask(pad, causal)))(
    q, k, v, pad
  )[0]
  want = einsum_vjp(q, k, v, pad, g, causal=causal)[0]
  np.testing.assert_allclose(as_np(out), as_np(want), atol=2e-6)


def test_dropout_and_relative_positions_are_refused():
  with pytest.raises(UserError, match='blocked softmax path has no attention'):
    oracle.make(
      {'name': 'softmax', 'implementation': 'blocked'}, dropout_rate=0.1
    )
  with pytest.raises(UserError, match='blocked softmax path has no relative'):
    oracle.make(
      {'name': 'softmax', 'implementation': 'blocked', 'relative': True}
    )


def memory(implementation, length):
  return core_memory_bytes(
    {'name': 'softmax', 'implementation': implementation},
    length,
    num_heads=1,
  )


def test_memory_is_linear_and_small():
  """Forward + backward temporaries (XLA's memory analysis, B = H = 1,
  D = 16): under 5% of the einsum path's at L = 4K, for 'blocked' and for
  'fused' on CPU, and growing linearly: each doubling of L adds twice what
  the previous one added (the einsum path's temporaries grow ~4x)."""
  einsum = memory('einsum', 4096)
  assert memory('fused', 4096) < 0.05 * einsum
  temp_1k, temp_2k, temp_4k = (memory('blocked', n) for n in (1024, 2048, 4096))
  assert temp_4k < 0.05 * einsum, (temp_4k, einsum)
  assert temp_1k < temp_2k < temp_4k
  growth = (temp_4k - temp_2k) / (temp_2k - temp_1k)
  assert 1.5 < growth < 2.5, (temp_1k, temp_2k, temp_4k)
