"""BigBird: ITC block pattern against the dense oracle, layout, exact limits."""

import attention_oracle as ao
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import listops as listops_config
from lra import data as tasks
from lra.errors import UserError
import models.attention.bigbird  # noqa: F401
from models.attention.bigbird import random_layout
from models.attention.memory import core_memory_bytes
from models.attention.registry import get_core_class
from models.classifier import build_model

B, H, D, BLOCK = 2, 2, 8, 8


def itc_pattern(length, block, blocks_HxNxR, valid_HxNxR):
  """bool[H, L, L]: the ITC pattern written out block by block."""
  heads = blocks_HxNxR.shape[0]
  n = -(-length // block)
  block_pattern = np.zeros((heads, n, n), bool)
  for h in range(heads):
    for qb in range(n):
      for kb in range(n):
        block_pattern[h, qb, kb] = (
          qb in (0, n - 1)
          or kb in (0, n - 1)
          or abs(qb - kb) <= 1
          or kb in blocks_HxNxR[h, qb][valid_HxNxR[h, qb]]
        )
  ids = np.arange(length) // block
  return block_pattern[:, ids][:, :, ids]


def qkv(seed, batch=B, length=37):
  """Three normal [B, L, H, D] float32 arrays (numpy: no eager compiles)."""
  rng = np.random.default_rng(seed)
  shape = (batch, length, H, D)
  return [jnp.asarray(rng.normal(size=shape), jnp.float32) for _ in range(3)]


def padding(lengths, length):
  return np.arange(length)[None, :] < np.asarray(lengths)[:, None]


_JITTED = {}


def run(core, q, k, v, pad=None, causal=False, rngs=None):
  """core(...)[0] as numpy, jitted (one compile instead of op-by-op)."""
  if (core, causal) not in _JITTED:
    _JITTED[core, causal] = jax.jit(
      lambda q, k, v, pad, rngs: core(q, k, v, ao.Mask(pad, causal), rngs=rngs)[
        0
      ]
    )
  out = _JITTED[core, causal](q, k, v, pad, rngs)
  return np.asarray(out, np.float64)


def check_against_oracle(core, length, pad_lengths, causal=False, seed=0):
  q, k, v = qkv(seed, B, length)
  pad = padding(pad_lengths, length)
  blocks, valid = core.layout(length)
  pattern = itc_pattern(length, core.block_size, blocks, valid)
  allowed = ao.allowed_mask(pattern, pad, causal)
  out = run(core, q, k, v, pad, causal)
  ref = ao.dense_reference(q, k, v, allowed)
  # Padded queries are unconstrained; compare real ones.
  real = np.asarray(pad)
  np.testing.assert_allclose(out[real], ref[real], atol=1e-5)
  return pattern


@pytest.fixture(scope='module')
def core_r0():
  return ao.make(
    {'name': 'bigbird', 'block_size': BLOCK, 'num_random_blocks': 0},
    num_heads=H,
    head_dim=D,
  )


@pytest.fixture(scope='module')
def core_r2():
  return ao.make(
    {'name': 'bigbird', 'block_size': BLOCK, 'num_random_blocks': 2},
    num_heads=H,
    head_dim=D,
  )


@pytest.mark.parametrize('length', [37, 64, 100])
def test_r0_matches_dense_itc_pattern(core_r0, length):
  pattern = check_against_oracle(core_r0, length, [length, length - 13])
  # The pattern is genuinely sparse, so the test is not plain softmax.
  assert not pattern.all()


@pytest.mark.parametrize('length', [37, 100])
def test_r0_causal_matches_dense_pattern(core_r0, length):
  check_against_oracle(core_r0, length, [length, length - 9], causal=True)


@pytest.mark.parametrize('length', [64, 100])
def test_random_blocks_match_dense_pattern_from_layout(core_r2, length):
  blocks, valid = core_r2.layout(length)
  assert valid.any()
  check_against_oracle(core_r2, length, [length, length - 21])
  check_against_oracle(core_r2, length, [length, length - 5], causal=True)


def test_causal_by_gradient(core_r2):
  """Output t has zero gradient w.r.t. every input after t."""
  q, k, v = qkv(4, 1, 64)

  @jax.jit
  def grads(q, k, v):
    def f(q, k, v, t):
      out = core_r2(q, k, v, ao.Mask(None, True))[0]
      return out[:, t].sum()

    ts = jnp.array([3, 30, 60])
    return jax.vmap(jax.grad(f, argnums=(0, 1, 2)), (None, None, None, 0))(
      q, k, v, ts
    )

  g = sum(np.abs(np.asarray(x)).sum(axis=(1, 3, 4)) for x in grads(q, k, v))
  for row, t in zip(g, (3, 30, 60)):
    assert (row[t + 1 :] == 0).all() and row[: t + 1].sum() > 0


@pytest.mark.parametrize(
  'length, r', [(24, 0), (17, 3), (20, 1), (64, 4), (100, 9)]
)
def test_exact_limit_equals_softmax(length, r):
  """3 blocks covering L, or r taking every remaining block: plain softmax."""
  core = ao.make(
    {'name': 'bigbird', 'block_size': BLOCK, 'num_random_blocks': r},
    num_heads=H,
    head_dim=D,
  )
  n = -(-length // BLOCK)
  # Rows 1 and N - 2 have N - 4 candidate blocks, the others N - 5.
  assert n <= 3 or r >= n - 4
  q, k, v = qkv(1, B, length)
  pad = padding([length, length - 6], length)
  allowed = ao.allowed_mask(ao.full_pattern(length), pad)
  out = run(core, q, k, v, pad)
  real = np.asarray(pad)
  ref = ao.dense_reference(q, k, v, allowed)
  np.testing.assert_allclose(out[real], ref[real], atol=1e-5)


def test_not_exact_below_the_limit():
  """r one short of taking every remaining block differs from softmax."""
  length, n = 64, 8  # r = N - 5: rows 1 and N - 2 miss one block.
  core = ao.make(
    {'name': 'bigbird', 'block_size': BLOCK, 'num_random_blocks': n - 5},
    num_heads=H,
    head_dim=D,
  )
  q, k, v = qkv(1, B, length)
  ref = ao.dense_reference(q, k, v, ao.full_pattern(length))
  assert np.abs(run(core, q, k, v) - ref).max() > 1e-3


def test_layout_reproducible_and_varies_by_head_and_layer():
  n, r, heads = 16, 3, 4
  blocks, valid = random_layout(0, 0, heads, n, r)
  random_layout.cache_clear()
  again, again_valid = random_layout(0, 0, heads, n, r)
  np.testing.assert_array_equal(blocks, again)
  np.testing.assert_array_equal(valid, again_valid)
  for h in range(1, heads):
    assert not np.array_equal(blocks[0], blocks[h])
  assert not np.array_equal(blocks, random_layout(0, 1, heads, n, r)[0])
  assert not np.array_equal(blocks, random_layout(1, 0, heads, n, r)[0])
  # The core exposes the layout of its own (seed, layer_index).
  core = ao.make(
    {'name': 'bigbird', 'block_size': 4, 'num_random_blocks': r, 'seed': 1},
    num_heads=heads,
    layer_index=2,
  )
  np.testing.assert_array_equal(
    core.layout(n * 4)[0], random_layout(1, 2, heads, n, r)[0]
  )


@pytest.mark.parametrize('n, r', [(16, 3), (9, 4), (8, 3), (7, 5)])
def test_layout_rows_have_r_distinct_blocks_outside_window(n, r):
  blocks, valid = random_layout(3, 1, 4, n, r)
  assert blocks.shape == valid.shape == (4, n, r)
  assert not valid[:, 0].any() and not valid[:, n - 1].any()
  for h in range(4):
    for i in range(1, n - 1):
      chosen = blocks[h, i][valid[h, i]]
      outside = set(range(n)) - {0, i - 1, i, i + 1, n - 1}
      assert len(chosen) == min(r, len(outside))
      assert len(set(chosen.tolist())) == len(chosen)
      assert set(chosen.tolist()) <= outside


def test_random_blocks_change_the_output(core_r2):
  other = ao.make(
    {'name': 'bigbird', 'block_size': BLOCK, 'num_random_blocks': 2},
    num_heads=H,
    head_dim=D,
    layer_index=1,
  )
  q, k, v = qkv(7, 1, 100)
  assert np.abs(run(core_r2, q, k, v) - run(other, q, k, v)).max() > 1e-3


def test_all_padding_last_block_and_empty_rows(core_r2):
  """Tail padding fills the last (global) block; an empty row gives zeros."""
  length = 64
  q, k, v = qkv(8, B, length)
  pad = padding([50, 0], length)
  out = run(core_r2, q, k, v, pad)
  assert np.isfinite(out).all()
  np.testing.assert_array_equal(out[1], 0.0)
  grads = jax.jit(jax.grad(lambda q: core_r2(q, k, v, ao.Mask(pad))[0].sum()))(
    q
  )
  assert np.isfinite(np.asarray(grads)).all()
  check_against_oracle(core_r2, length, [50, 3])


def test_dropout_uses_key():
  core = ao.make(
    {'name': 'bigbird', 'block_size': BLOCK, 'num_random_blocks': 1},
    num_heads=H,
    head_dim=D,
    dropout_rate=0.5,
  )
  q, k, v = qkv(5, 1, 40)
  a = run(core, q, k, v, rngs=jax.random.key(0))
  b = run(core, q, k, v, rngs=jax.random.key(0))
  c = run(core, q, k, v, rngs=jax.random.key(1))
  np.testing.assert_array_equal(a, b)
  assert not np.allclose(a, c)


def test_bfloat16_close_to_float32(core_r2):
  core16 = ao.make(
    {'name': 'bigbird', 'block_size': BLOCK, 'num_random_blocks': 2},
    num_heads=H,
    head_dim=D,
    dtype=jnp.bfloat16,
  )
  q, k, v = qkv(6, 1, 37)
  out16 = jax.jit(lambda q, k, v: core16(q, k, v, ao.Mask())[0])(
    *(t.astype(jnp.bfloat16) for t in (q, k, v))
  )
  assert out16.dtype == jnp.bfloat16
  np.testing.assert_allclose(
    np.asarray(out16, np.float32), run(core_r2, q, k, v), atol=0.1
  )


@pytest.mark.parametrize(
  'options, match',
  [
    ({'block_size': 0}, 'block_size must be an integer >= 1'),
    ({'num_random_blocks': -1}, 'num_random_blocks must be an integer >= 0'),
    ({'seed': 1.5}, 'seed must be an integer'),
  ],
)
def test_invalid_options(options, match):
  with pytest.raises(UserError, match=match):
    ao.make({'name': 'bigbird', **options})


def test_memory_grows_about_linearly():
  opts = {'name': 'bigbird', 'block_size': 64, 'num_random_blocks': 3}
  small = core_memory_bytes(opts, 1024)
  large = core_memory_bytes(opts, 4096)
  assert large / small <= 5, (small, large)


# The shared suite's settings for this core (tests/test_attention_suite.py).
SUITE = dict(
  opts={'block_size': 4, 'num_random_blocks': 2},
  exact={'block_size': 16, 'num_random_blocks': 0},
)


# ------------------------------------------------- ETC (issue #21)
def etc_pattern(g, length, block, blocks_HxNxS, valid_HxNxS):
  """bool[H, G + L, G + L]: G global tokens first (they see every key and
  every query sees them), then the real tokens' window + random blocks."""
  heads = blocks_HxNxS.shape[0]
  n = -(-length // block)
  block_pattern = np.zeros((heads, n, n), bool)
  for h in range(heads):
    for qb in range(n):
      seen = blocks_HxNxS[h, qb][valid_HxNxS[h, qb]]
      block_pattern[h, qb, seen] = True
      # The definition: window i - 1, i, i + 1 always in.
      for kb in (qb - 1, qb, qb + 1):
        if 0 <= kb < n:
          assert block_pattern[h, qb, kb]
  ids = np.arange(length) // block
  out = np.ones((heads, g + length, g + length), bool)
  out[:, g:, g:] = block_pattern[:, ids][:, :, ids]
  return out


def etc_core(g=3, r=2, **kw):
  return ao.make(
    {
      'name': 'bigbird',
      'block_size': BLOCK,
      'num_random_blocks': r,
      'global_mode': 'etc',
      'num_global_tokens': g,
    },
    num_heads=H,
    head_dim=D,
    **kw,
  )


@pytest.mark.parametrize('g, r, length', [(3, 2, 61), (1, 0, 40), (2, 1, 8)])
def test_etc_matches_dense_pattern(g, r, length):
  """The output at every real (unpadded) position, global tokens included,
  equals dense softmax under the ETC rule."""
  core = etc_core(g, r)
  assert core.etc_tokens == g
  q, k, v = qkv(10 + g, B, g + length)
  pad = padding([g + length, g + length - 11], g + length)
  blocks, valid = core.layout(g + length)
  pattern = etc_pattern(g, length, BLOCK, blocks, valid)
  if length > 2 * BLOCK:
    assert not pattern.all()  # genuinely sparse
  allowed = ao.allowed_mask(pattern, pad)
  out = run(core, q, k, v, pad)
  ref = ao.dense_reference(q, k, v, allowed)
  real = np.asarray(pad)
  np.testing.assert_allclose(out[real], ref[real], atol=1e-5)


def test_etc_exact_limit_and_global_tokens_matter():
  """N <= 2 real blocks: softmax; the global tokens are seen by all."""
  core = etc_core(2, 0)
  q, k, v = qkv(3, B, 2 + 2 * BLOCK)
  full = ao.dense_reference(q, k, v, ao.full_pattern(2 + 2 * BLOCK))
  np.testing.assert_allclose(run(core, q, k, v), full, atol=1e-5)
  q, k, v = qkv(4, 1, 2 + 40)
  v2 = v.at[:, 1].add(3.0)  # one global token's value
  moved = np.abs(run(core, q, k, v2) - run(core, q, k, v)).max(axis=(0, 2, 3))
  assert (moved > 1e-4).all()  # every position sees it


def test_etc_layout_rows():
  n, r = 9, 3
  blocks, valid = etc_core(2, r).layout(2 + n * BLOCK)
  assert blocks.shape == (H, n, 3 + r)
  for h in range(H):
    for i in range(n):
      chosen = set(blocks[h, i][valid[h, i]].tolist())
      window = {b for b in (i - 1, i, i + 1) if 0 <= b < n}
      assert window <= chosen
      assert len(chosen) == len(window) + r  # r distinct extra blocks
  # Shorter than r candidates: every block is taken (exact).
  blocks, valid = etc_core(2, 5).layout(2 + 4 * BLOCK)
  assert all(
    set(blocks[h, i][valid[h, i]].tolist()) == set(range(4))
    for h in range(H)
    for i in range(4)
  )


def test_etc_refuses_causal_and_bad_options():
  q, k, v = qkv(5, 1, 20)
  with pytest.raises(UserError, match="'bigbird' cannot be causal with glob"):
    run(etc_core(), q, k, v, causal=True)
  with pytest.raises(UserError, match='global_mode must be one of itc, etc'):
    ao.make({'name': 'bigbird', 'global_mode': 'ETC+'})
  with pytest.raises(UserError, match='num_global_tokens must be an integer'):
    ao.make({'name': 'bigbird', 'global_mode': 'etc', 'num_global_tokens': 0})
  cls = get_core_class('bigbird')
  assert cls.extra_tokens({'name': 'bigbird'}) == 0
  assert cls.extra_tokens({'global_mode': 'etc', 'num_global_tokens': 4}) == 4


def _etc_model(pooling, num_layers=1, mode='etc', objective='classify'):
  config = listops_config.get_config('bigbird,smoke')
  config.model.attention.global_mode = mode
  config.model.attention.num_global_tokens = 3
  config.model.attention.block_size = 8
  config.model.pooling = pooling
  config.model.num_layers = num_layers
  config.objective = objective
  return build_model(config, tasks.get_task('listops'))


def test_etc_encoder_prepends_and_removes_global_tokens():
  tokens = np.ones((2, 64), np.int32)
  tokens[1, 40:] = 0  # padding
  tokens = jnp.asarray(tokens)
  # Without blocks the encoder is LayerNorm(embedding + positions): the
  # global tokens leave nothing behind and shift no position.
  etc0, itc0 = _etc_model('cls', 0), _etc_model('cls', 0, 'itc')
  assert etc0.encoder.extra_GxE[...].shape == (3, 16)
  x, pad, _ = etc0.encoder(tokens)
  x_itc, pad_itc, _ = itc0.encoder(tokens)
  assert x.shape == (2, 65, 16)  # CLS + 64 tokens, no global tokens
  np.testing.assert_array_equal(np.asarray(pad), np.asarray(pad_itc))
  np.testing.assert_allclose(np.asarray(x), np.asarray(x_itc), atol=1e-6)
  # With a block every real position (the pooled CLS included) sees them.
  for pooling in ('cls', 'mean'):
    model = _etc_model(pooling)
    logits, _ = model(tokens)
    assert logits.shape == (2, 10) and np.isfinite(np.asarray(logits)).all()
    x, _, _ = model.encoder(tokens)
    other = jax.random.normal(jax.random.key(1), (3, 16))  # not a shift:
    model.encoder.extra_GxE[...] = other  # LayerNorm would undo one
    x2, _, _ = model.encoder(tokens)
    moved = np.abs(np.asarray(x2) - np.asarray(x)).max(axis=(0, 2))
    assert (moved > 1e-4).all()
    assert not np.allclose(np.asarray(model(tokens)[0]), np.asarray(logits))


def test_etc_causal_language_model_is_refused_at_build():
  with pytest.raises(UserError, match='cannot be causal'):
    _etc_model('cls', objective='causal_lm')


def test_etc_memory_grows_about_linearly():
  opts = {
    'name': 'bigbird',
    'block_size': 64,
    'num_random_blocks': 3,
    'global_mode': 'etc',
    'num_global_tokens': 2,
  }
  small = core_memory_bytes(opts, 1024)
  large = core_memory_bytes(opts, 4096)
  assert large / small <= 5, (small, large)
