"""Reformer LSH attention: exact limit, chunked pattern, hashing, randomness."""

import attention_oracle as ao
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lra.errors import UserError
from models.attention.memory import core_memory_bytes
from models.attention.reformer import ReformerAttention

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


def round_patterns(core, q, pad, causal, buckets=None):
  """bool [R, B, H, L, L]: the pairs each round attends (dense, numpy).

  Re-does the sort and chunk layout in numpy from the core's buckets (or
  `buckets` [B, H, R, L]): same bucket, key in the query's chunk or the one
  before it (wrapping round), key not padded, causal.
  """
  b, length, h, _ = q.shape
  if buckets is None:
    buckets = np.asarray(core.hash_buckets(q, core.rotation_key(None)))
  num_buckets = core.buckets_for(length)
  c = min(core.chunk_size, length)
  padded = -(-length // c) * c
  n = padded // c
  valid = np.zeros((b, padded), bool)
  valid[:, :length] = True if pad is None else np.asarray(pad)
  rounds = np.zeros((core.num_hashes, b, h, length, length), bool)
  for r in range(core.num_hashes):
    for bi in range(b):
      for hi in range(h):
        # Padded tokens sort last (by position) but keep their bucket.
        bucket = buckets[bi, hi, r]
        sort_bucket = np.full(padded, num_buckets)
        sort_bucket[:length] = bucket
        sort_bucket[~valid[bi]] = num_buckets
        order = np.lexsort((np.arange(padded), sort_bucket))
        chunk = np.empty(padded, int)
        chunk[order] = np.arange(padded) // c
        ci, cj = chunk[:length, None], chunk[None, :length]
        near = (cj == ci) | (cj == (ci - 1) % n)
        same = bucket[:, None] == bucket[None, :]
        rounds[r, bi, hi] = near & same & valid[bi, None, :length]
  if causal:
    rounds &= np.tril(np.ones((length, length), bool))
  return rounds


def union_reference(core, q, v, pad, causal, buckets=None):
  """The paper's multi-round attention, written directly: one softmax over
  the union of the rounds' pairs (each key once), the self rule as its
  -1e5 logit (float64)."""
  union = round_patterns(core, q, pad, causal, buckets).any(0)
  s = np.einsum(
    'blhd,bmhd->bhlm', np.asarray(q, np.float64), unit(q)
  ) / np.sqrt(q.shape[-1])
  s = np.where(union, s - 1e5 * np.eye(q.shape[1]), -np.inf)
  top = np.max(s, -1, keepdims=True)
  w = np.where(union, np.exp(s - np.where(np.isfinite(top), top, 0)), 0)
  w = w / np.maximum(w.sum(-1, keepdims=True), 1e-300)
  return np.einsum('bhlm,bmhd->blhd', w, np.asarray(v, np.float64))


def chunked_reference(core, q, v, pad, causal):
  """Dense float64 oracle of the rounds combined without de-duplication
  (dedup=False): each round's softmax over its pairs (the self rule as the
  paper's -1e5 self logit), combined by softmax of their log-sum-exp.
  """
  q64, v64 = (np.asarray(t, np.float64) for t in (q, v))
  d = q.shape[-1]
  outs, lses = [], []
  for allowed in round_patterns(core, q, pad, causal):
    s = np.einsum('blhd,bmhd->bhlm', q64, unit(q)) / np.sqrt(d)
    s = s - 1e5 * np.eye(q.shape[1])
    s = np.where(allowed, s, -np.inf)
    top = np.max(s, -1, keepdims=True)
    top = np.where(np.isfinite(top), top, 0)
    w = np.where(allowed, np.exp(s - top), 0)
    total = w.sum(-1, keepdims=True)
    outs.append(
      np.einsum('bhlm,bmhd->blhd', w / np.where(total > 0, total, 1), v64)
    )
    lse = np.where(total > 0, top + np.log(np.where(total > 0, total, 1)), -1e9)
    lses.append(lse[..., 0].transpose(0, 2, 1))  # [B, L, H]
  lse = np.stack(lses)
  weight = np.exp(lse - lse.max(0))
  weight /= weight.sum(0)
  return np.einsum('rblh,rblhd->blhd', weight, np.stack(outs))


LSH3 = reformer(num_buckets=4, num_hashes=3, chunk_size=8)


@pytest.mark.parametrize('causal', [False, True])
def test_rounds_attend_to_their_union_each_key_once(causal):
  """3 rounds against the union softmax; the example has pairs seen in 2
  and in 3 rounds, which the plain combination weighs 2x and 3x."""
  q, _, v = ao.qkv(1, length=L, heads=H, dim=D)
  pad = ao.padding([L, 29], L)
  out = run(LSH3, q, v, pad, causal)
  want = union_reference(LSH3, q, v, pad, causal)
  # Padded queries too: they attend to the real keys of their window.
  np.testing.assert_allclose(out, want, atol=1e-5)
  counts = round_patterns(LSH3, q, pad, causal).sum(0)
  off_diagonal = counts[..., ~np.eye(L, dtype=bool)]
  assert (off_diagonal == 2).sum() > 20 and (off_diagonal == 3).sum() > 20
  plain = chunked_reference(LSH3, q, v, pad, causal)
  assert np.abs(plain - want).max() > 1e-2


@pytest.mark.parametrize('causal', [False, True])
def test_dedup_false_is_the_plain_combination(causal):
  q, _, v = ao.qkv(1, length=L, heads=H, dim=D)
  pad = ao.padding([L, 29], L)
  core = reformer(num_buckets=4, num_hashes=2, chunk_size=8, dedup=False)
  out = run(core, q, v, pad, causal)
  np.testing.assert_allclose(
    out, chunked_reference(core, q, v, pad, causal), atol=1e-5
  )


class FixedHashReformer(ReformerAttention):
  """Reformer whose buckets are given ([H][R][L] nested tuples)."""

  def __init__(self, buckets, **kw):
    super().__init__(**kw)
    self.fixed = buckets

  def hash_buckets(self, q_BxLxHxD, key):
    b = q_BxLxHxD.shape[0]
    bucket_HxRxL = jnp.asarray(self.fixed, jnp.int32)
    return jnp.broadcast_to(bucket_HxRxL, (b, *bucket_HxRxL.shape))


def test_key_shared_in_two_of_three_rounds_counts_once():
  """Hand-set buckets, one chunk: token 0 meets token 1 in rounds 0 and 2
  and token 2 in round 1 only. Its weights are softmax over {1, 2}; the
  plain combination gives token 1 twice its weight."""
  buckets = (
    (
      (0, 0, 1, 1, 2, 2, 3, 3),
      (0, 1, 0, 1, 2, 3, 2, 3),
      (0, 0, 1, 1, 3, 2, 3, 2),
    ),
  )
  q, _, v = ao.qkv(9, batch=1, length=8, heads=1, dim=D)
  v = jnp.zeros_like(v).at[0, 1, 0, 0].set(1.0).at[0, 2, 0, 1].set(1.0)
  kw = dict(
    num_heads=1,
    head_dim=D,
    max_length=8,
    dropout_rate=0.0,
    dtype=jnp.float32,
    rngs=nnx.Rngs(0),
    num_hashes=3,
    num_buckets=4,
    chunk_size=8,
  )
  s = np.asarray(q, np.float64)[0, 0, 0] @ unit(q)[0, :3, 0].T / np.sqrt(D)
  for dedup, times in ((True, 1), (False, 2)):
    core = FixedHashReformer(buckets, dedup=dedup, **kw)
    out = run(core, q, v)[0, 0, 0, :2]  # weights of tokens 1 and 2
    e1, e2 = times * np.exp(s[1]), np.exp(s[2])
    np.testing.assert_allclose(out, [e1 / (e1 + e2), e2 / (e1 + e2)], atol=1e-6)
  # The same against the union oracle for every token.
  core = FixedHashReformer(buckets, **kw)
  want = union_reference(core, q, v, None, False, np.asarray(buckets)[None])
  np.testing.assert_allclose(run(core, q, v), want, atol=1e-6)


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
    {'num_buckets': -2},
    {'num_hashes': 0},
    {'chunk_size': 0},
    {'dedup': 'yes'},
  ],
)
def test_invalid_options_are_user_errors(opts):
  with pytest.raises(UserError, match='Reformer'):
    reformer(**opts)


def test_memory_grows_linearly():
  """The defaults (automatic buckets: 32 at 1K, 128 at 4K) with 2 rounds,
  de-duplicated: about 4x from 1K to 4K."""
  opts = {'name': 'reformer', 'chunk_size': 64, 'num_hashes': 2}
  small = core_memory_bytes(opts, 1024)
  large = core_memory_bytes(opts, 4096)
  assert large / small <= 5, (small, large)


# The shared suite's settings for this core (tests/test_attention_suite.py).
def reformer_reference(q, v, pad, causal):
  """Softmax over visible j != i of q_i . q_j/|q_j| / sqrt(D); self only
  when nothing else is visible (Reformer's rule, one bucket, one chunk)."""
  b, length = q.shape[:2]
  k = np.asarray(q) / np.linalg.norm(np.asarray(q), axis=-1, keepdims=True)
  allowed = ao.allowed_mask(ao.full_pattern(length), pad, causal)
  allowed = np.broadcast_to(allowed, (b, 1, length, length)).copy()
  eye = np.eye(length, dtype=bool)
  others = allowed & ~eye
  alone = ~others.any(-1, keepdims=True) & allowed & eye
  return ao.dense_reference(q, k, v, others | alone)


SUITE = dict(
  opts={'num_buckets': 4, 'chunk_size': 8},
  exact={'num_buckets': 1, 'chunk_size': 64},
  reference=reformer_reference,
  # bf16 rounding moves tokens near a bucket boundary to another bucket.
  bf16='exact',
)


def test_automatic_bucket_count_is_two_per_chunk():
  auto = reformer(chunk_size=64)
  assert auto.num_buckets == 0  # the default
  assert [auto.buckets_for(n) for n in (4096, 4097, 1000, 64, 10)] == [
    128,
    130,
    32,
    2,
    2,
  ]
  assert reformer(num_buckets=10).buckets_for(4096) == 10
  # The hash uses that many: 2 ceil(37 / 8) = 10 buckets at L = 37.
  q, _, _ = ao.qkv(10, length=L, heads=H, dim=D)
  core = reformer(chunk_size=8, num_hashes=2)
  bucket = np.asarray(core.hash_buckets(q, core.rotation_key(None)))
  assert bucket.max() == 9 and len(np.unique(bucket)) >= 8


def same_bucket_keys_seen(core, q):
  """Of the key pairs sharing a query's bucket, the fraction in its chunk or
  the previous one (round 0, every head), from the core's hash."""
  bucket_HxL = np.asarray(core.hash_buckets(q, core.rotation_key(None)))[0]
  bucket_HxL = bucket_HxL[:, 0]
  length, c = bucket_HxL.shape[-1], core.chunk_size
  n = length // c
  seen = total = 0
  for bucket in bucket_HxL:
    chunk = np.empty(length, int)
    chunk[np.lexsort((np.arange(length), bucket))] = np.arange(length) // c
    counts = np.zeros((bucket.max() + 1, n), int)
    np.add.at(counts, (bucket, chunk), 1)
    seen += (counts[bucket, chunk] + counts[bucket, (chunk - 1) % n]).sum()
    total += counts.sum(1)[bucket].sum()
  return seen / total


def test_automatic_buckets_fit_the_window_at_4k():
  """At 4K, chunk 64: ten buckets of ~410 tokens leave most same-bucket
  keys out of a query's two chunks; 128 buckets keep most of them."""
  length = 4096
  q = ao.qkv(11, batch=1, length=length, heads=2, dim=64)[0]

  def core(num_buckets):
    return ao.make(
      {'name': 'reformer', 'num_buckets': num_buckets, 'chunk_size': 64},
      num_heads=2,
      head_dim=64,
      max_length=length,
    )

  ten, auto = (
    same_bucket_keys_seen(core(10), q),
    same_bucket_keys_seen(core(0), q),
  )
  assert ten < 0.35 and auto > 0.75, (ten, auto)


@pytest.mark.parametrize('causal', [False, True])
def test_automatic_buckets_several_rounds_match_the_union(causal):
  q, _, v = ao.qkv(12, length=L, heads=H, dim=D)
  pad = ao.padding([L, 25], L)
  core = reformer(chunk_size=8, num_hashes=2)
  np.testing.assert_allclose(
    run(core, q, v, pad, causal),
    union_reference(core, q, v, pad, causal),
    atol=1e-5,
  )
