"""Reformer LSH attention: exact limit, chunked pattern, hashing, randomness."""

import attention_oracle as ao
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lra.errors import UserError
from models.attention.memory import core_memory_bytes
import models.attention.reformer  # noqa: F401

H, D = 2, 8
L = 37  # not a multiple of 8: the core pads to 40 (five chunks of 8)


def reformer(layer_index=0, **opts):
  return ao.make(
    {'name': 'reformer', **opts},
    num_heads=H,
    head_dim=D,
    layer_index=layer_index,
  )


# The chunked core most tests share (compiled once per mask kind).
LSH = reformer(num_buckets=4, num_hashes=2, chunk_size=8)
_JITTED = {}  # (id(core), causal) -> (core, jitted call); keeps core alive


def run(core, q, v, pad=None, causal=False, rngs=None):
  """core(q, q, v, ...)[0] as float64 numpy, compiled once per core and mask."""
  if (id(core), causal) not in _JITTED:
    fn = jax.jit(
      lambda q, v, pad, key: core(q, q, v, ao.Mask(pad, causal), rngs=key)[0]
    )
    _JITTED[id(core), causal] = core, fn
  return np.asarray(_JITTED[id(core), causal][1](q, v, pad, rngs), np.float64)


def unit(q):
  q = np.asarray(q, np.float64)
  return q / np.linalg.norm(q, axis=-1, keepdims=True)


def self_rule(pattern_BxHxLxL):
  """Drops j == i, then gives i itself back when it has no other key.

  pattern: the visible pairs including the diagonal (padding, causal, ...).
  """
  eye = np.eye(pattern_BxHxLxL.shape[-1], dtype=bool)
  others = pattern_BxHxLxL & ~eye
  alone = ~others.any(-1, keepdims=True)
  return others | (pattern_BxHxLxL & eye & alone)


def exact_reference(q, v, pad, causal):
  """The exact limit: softmax over visible j != i of q_i . k_j / sqrt(D)."""
  b, length = q.shape[:2]
  allowed = ao.allowed_mask(ao.full_pattern(length), pad, causal)
  allowed = self_rule(allowed & np.ones((b, H, 1, 1), bool))
  return ao.dense_reference(q, unit(q), v, allowed)


@pytest.mark.parametrize('causal', [False, True])
def test_exact_limit_one_bucket_one_chunk(causal):
  """num_buckets=1, chunk_size >= L: softmax over visible j != i."""
  q, _, v = ao.qkv(0, length=L, heads=H, dim=D)
  # Second example: one real token, which has only itself to attend to.
  pad = ao.padding([L, 1] if not causal else [L, 23], L)
  core = reformer(num_buckets=1, chunk_size=64)
  out = run(core, q, v, pad, causal)
  want = exact_reference(q, v, pad, causal)
  # Padded queries too: they attend to the real keys of their window.
  np.testing.assert_allclose(out, want, atol=1e-5)
  if not causal:
    # The lone token returns its own value; causal: token 0 does.
    np.testing.assert_allclose(out[1, 0], v[1, 0], atol=1e-6)
  else:
    np.testing.assert_allclose(out[:, 0], v[:, 0], atol=1e-6)


def chunked_reference(core, q, v, pad, causal):
  """Dense float64 oracle of the sorted, chunked, multi-round pattern.

  Re-does the sort and chunk layout in numpy from the core's buckets, builds
  each round's [B, H, L, L] pattern (same bucket, key in the query's chunk or
  the one before it, wrapping round), applies the self rule as the paper's
  -1e5 self logit, and combines the rounds by softmax of their log-sum-exp.
  """
  b, length, h, d = q.shape
  buckets = np.asarray(core.hash_buckets(q, core.rotation_key(None)))
  c = min(core.chunk_size, length)
  padded = -(-length // c) * c
  n = padded // c
  valid = np.zeros((b, padded), bool)
  valid[:, :length] = np.asarray(pad)
  qn, kn, vn = (np.asarray(t, np.float64) for t in (q, unit(q), v))
  outs, lses = [], []
  for r in range(core.num_hashes):
    allowed = np.zeros((b, h, length, length), bool)
    for bi in range(b):
      for hi in range(h):
        # Padded tokens sort last (by position) but keep their bucket.
        bucket = buckets[bi, hi, r]
        sort_bucket = np.full(padded, core.num_buckets)
        sort_bucket[:length] = bucket
        sort_bucket[~valid[bi]] = core.num_buckets
        order = np.lexsort((np.arange(padded), sort_bucket))
        chunk = np.empty(padded, int)
        chunk[order] = np.arange(padded) // c
        ci, cj = chunk[:length, None], chunk[None, :length]
        near = (cj == ci) | (cj == (ci - 1) % n)
        same = bucket[:, None] == bucket[None, :]
        allowed[bi, hi] = near & same & valid[bi, None, :length]
    if causal:
      allowed &= np.tril(np.ones((length, length), bool))
    s = np.einsum('blhd,bmhd->bhlm', qn, kn) / np.sqrt(d)
    s = s - 1e5 * np.eye(length)
    s = np.where(allowed, s, -np.inf)
    top = np.max(s, -1, keepdims=True)
    top = np.where(np.isfinite(top), top, 0)
    w = np.where(allowed, np.exp(s - top), 0)
    total = w.sum(-1, keepdims=True)
    outs.append(
      np.einsum('bhlm,bmhd->blhd', w / np.where(total > 0, total, 1), vn)
    )
    lse = np.where(total > 0, top + np.log(np.where(total > 0, total, 1)), -1e9)
    lses.append(lse[..., 0].transpose(0, 2, 1))  # [B, L, H]
  lse = np.stack(lses)
  weight = np.exp(lse - lse.max(0))
  weight /= weight.sum(0)
  return np.einsum('rblh,rblhd->blhd', weight, np.stack(outs))


@pytest.mark.parametrize('causal', [False, True])
def test_chunked_multi_round_pattern_matches_dense_oracle(causal):
  q, _, v = ao.qkv(1, length=L, heads=H, dim=D)
  pad = ao.padding([L, 29], L)
  out = run(LSH, q, v, pad, causal)
  want = chunked_reference(LSH, q, v, pad, causal)
  # Padded queries too: they attend to the real keys of their window.
  np.testing.assert_allclose(out, want, atol=1e-5)


def test_angular_hash_properties():
  core = reformer(num_buckets=6, num_hashes=2)
  q, _, _ = ao.qkv(2, length=50, heads=H, dim=D)
  key = core.rotation_key(None)
  bucket = np.asarray(core.hash_buckets(q, key))
  assert bucket.shape == (2, H, 2, 50)
  assert bucket.min() >= 0 and bucket.max() < 6
  assert len(np.unique(bucket)) == 6  # all buckets in use at L = 50
  # Angular: scale-free, and -x lands in the opposite bucket.
  np.testing.assert_array_equal(core.hash_buckets(3.0 * q, key), bucket)
  np.testing.assert_array_equal(core.hash_buckets(-q, key), (bucket + 3) % 6)
  one = reformer(num_buckets=1).hash_buckets(q, key)
  assert np.all(np.asarray(one) == 0)


def test_randomness_from_keys_and_seed():
  q, _, v = ao.qkv(3, length=L, heads=H, dim=D)
  pad = ao.padding([L, L], L)
  k1, k2 = jax.random.key(1), jax.random.key(2)
  a = run(LSH, q, v, pad, rngs=k1)
  np.testing.assert_array_equal(a, run(LSH, q, v, pad, rngs=k1))
  assert np.abs(a - run(LSH, q, v, pad, rngs=k2)).max() > 1e-3
  e = run(LSH, q, v, pad)
  np.testing.assert_array_equal(e, run(LSH, q, v, pad))
  assert np.abs(e - a).max() > 1e-3

  # Rotations: evaluation from (seed, layer_index), the same for a fresh
  # core; training from the step key, different per layer.
  def buckets(core, key):
    return np.asarray(core.hash_buckets(q, core.rotation_key(key)))

  opts = dict(num_buckets=4, num_hashes=2, chunk_size=8)
  seed1, layer1 = reformer(seed=1, **opts), reformer(layer_index=1, **opts)
  np.testing.assert_array_equal(
    buckets(LSH, None), buckets(reformer(**opts), None)
  )
  for other, key in [(seed1, None), (layer1, None), (layer1, k1)]:
    assert np.mean(buckets(LSH, key) != buckets(other, key)) > 0.3


def test_several_buckets_differ_from_exact_but_finite():
  q, _, v = ao.qkv(4, length=L, heads=H, dim=D)
  pad = ao.padding([L, L], L)
  exact = exact_reference(q, v, pad, False)
  out = run(LSH, q, v, pad)
  assert np.all(np.isfinite(out))
  assert np.abs(out - exact).max() > 1e-2


@pytest.mark.parametrize('causal', [False, True])
def test_padding_invariance_several_buckets(causal):
  """Padded tokens (their q, hence their keys, and v) change nothing real."""
  q, _, v = ao.qkv(5, length=L, heads=H, dim=D)
  pad = ao.padding([L, 19], L)
  noise = jax.random.normal(jax.random.key(9), q.shape) * 50
  keep = pad[:, :, None, None]
  q2, v2 = jnp.where(keep, q, noise), jnp.where(keep, v, -noise)
  real = np.asarray(pad)
  key = jax.random.key(0) if causal else None
  a = run(LSH, q, v, pad, causal, rngs=key)
  b = run(LSH, q2, v2, pad, causal, rngs=key)
  np.testing.assert_allclose(a[real], b[real], atol=1e-6)


def test_causal_by_gradient_and_fully_padded_row():
  """Output t has no gradient from later tokens (q is also the key)."""
  q, _, v = ao.qkv(6, length=L, heads=H, dim=D)
  pad = ao.padding([L, 0], L)  # second example fully padded

  @jax.jit
  def grads(q, v, t):
    def f(q, v, causal):
      out_BxLxHxD = LSH(q, q, v, ao.Mask(pad, causal))[0]
      return jnp.take(out_BxLxHxD[:1], t, axis=1).sum(), out_BxLxHxD

    return [
      jax.grad(f, argnums=(0, 1), has_aux=True)(q, v, c) for c in (False, True)
    ]

  later = np.arange(L)[None, :, None, None]
  for t in [0, 13, 31]:
    ((gq, gv), out), ((cq, cv), causal_out) = grads(q, v, t)
    for g in (gq, gv, cq, cv):
      assert np.all(np.isfinite(np.asarray(g)))
    assert np.abs(np.where(later > t, cq, 0)).sum() == 0
    assert np.abs(np.where(later > t, cv, 0)).sum() == 0
    assert np.abs(np.where(later > t, gq, 0)).sum() > 0  # non-causal does
  assert np.all(np.asarray(out)[1] == 0)
  assert np.all(np.asarray(causal_out)[1] == 0)


def test_dropout_on_the_weights():
  q, _, v = ao.qkv(7, length=L, heads=H, dim=D)
  pad = ao.padding([L, L], L)
  core = ao.make(
    {'name': 'reformer', 'num_buckets': 4, 'num_hashes': 2, 'chunk_size': 8},
    num_heads=H,
    head_dim=D,
    dropout_rate=0.5,
  )
  key = jax.random.key(3)
  dropped = run(core, q, v, pad, rngs=key)
  assert np.all(np.isfinite(dropped))
  assert np.abs(dropped - run(LSH, q, v, pad, rngs=key)).max() > 1e-2


def test_bfloat16_returns_compute_dtype():
  q, _, v = ao.qkv(8, length=24, heads=H, dim=D)
  core = ao.make(
    {'name': 'reformer', 'num_buckets': 1, 'chunk_size': 64},
    num_heads=H,
    head_dim=D,
    dtype=jnp.bfloat16,
  )
  q16, v16 = q.astype(jnp.bfloat16), v.astype(jnp.bfloat16)
  out = jax.jit(lambda q, v: core(q, q, v, ao.Mask())[0])(q16, v16)
  assert out.dtype == jnp.bfloat16
  exact = exact_reference(q, v, None, False)
  np.testing.assert_allclose(np.asarray(out, np.float64), exact, atol=5e-2)


@pytest.mark.parametrize(
  'opts',
  [
    {'num_buckets': 3},
    {'num_buckets': 0},
    {'num_hashes': 0},
    {'chunk_size': 0},
  ],
)
def test_invalid_options_are_user_errors(opts):
  with pytest.raises(UserError, match='Reformer'):
    reformer(**opts)


def test_memory_grows_linearly():
  opts = {'name': 'reformer', 'chunk_size': 64, 'num_buckets': 32}
  small = core_memory_bytes(opts, 1024)
  large = core_memory_bytes(opts, 4096)
  assert large / small <= 5, (small, large)
