"""Sparse Transformer: strided / fixed / mixed patterns against the oracle."""

import attention_oracle as oracle
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lra.errors import UserError
from models.attention.memory import core_memory_bytes
import models.attention.sparse_transformer  # noqa: F401

H, D = 4, 8
STRIDE, SUMMARY = 8, 3


run = oracle.run
depends_on_future = oracle.depends_on_future


def strided_pattern(length, stride):
  i = np.arange(length)[:, None]
  j = np.arange(length)[None, :]
  return (np.abs(i - j) < stride) | ((i - j) % stride == 0)


def fixed_pattern(length, stride, summary):
  i = np.arange(length)[:, None]
  j = np.arange(length)[None, :]
  return (i // stride == j // stride) | (j % stride >= stride - summary)


def pattern(name, length, heads=H, stride=STRIDE, summary=SUMMARY):
  """bool[H, L, L], the issue's formulas written out densely."""
  s = strided_pattern(length, stride)
  f = fixed_pattern(length, stride, summary)
  per_head = {
    'strided': [s] * heads,
    'fixed': [f] * heads,
    'mixed': [s] * (heads // 2) + [f] * (heads - heads // 2),
  }[name]
  return np.stack(per_head)


def parts(name, length, stride=STRIDE, summary=SUMMARY):
  """(A(1), A(2)) of a factorisation, bool[L, L] each (the paper's parts)."""
  i = np.arange(length)[:, None]
  j = np.arange(length)[None, :]
  if name == 'strided':
    return np.abs(i - j) < stride, (i - j) % stride == 0
  summaries = np.broadcast_to(
    j % stride >= stride - summary, i.shape[:1] + j.shape[1:]
  )
  return i // stride == j // stride, summaries


def combined_pattern(name, combine, length, layer_index=0, heads=H, **kw):
  """bool[H, L, L]: which part each head sees under `combine`."""
  groups = {
    'mixed': [('strided', heads // 2), ('fixed', heads - heads // 2)],
  }.get(name, [(name, heads)])
  per_head = []
  for factorisation, count in groups:
    a1, a2 = parts(factorisation, length, **kw)
    if combine == 'merged':
      per_head += [a1 | a2] * count
    elif combine == 'interleaved':
      per_head += [a1 if layer_index % 2 == 0 else a2] * count
    else:
      per_head += [a1] * (count // 2) + [a2] * (count - count // 2)
  return np.stack(per_head)


def make(name, stride=STRIDE, summary=SUMMARY, heads=H, combine=None, **kw):
  opts = {
    'name': 'sparse_transformer',
    'pattern': name,
    'stride': stride,
    'summary': summary,
  }
  if combine is not None:
    opts['combine'] = combine
  return oracle.make(opts, num_heads=heads, head_dim=D, **kw)


@pytest.mark.parametrize('name', ['strided', 'fixed', 'mixed'])
@pytest.mark.parametrize('length', [37, 64, 100])
@pytest.mark.parametrize('causal', [False, True])
def test_matches_dense_pattern(name, length, causal):
  core = make(name)
  q, k, v = oracle.qkv(seed=length, length=length, heads=H, dim=D)
  pad = oracle.padding([length, length - 9], length)
  out = run(core, q, k, v, pad, causal)
  allowed = oracle.allowed_mask(pattern(name, length), pad, causal)
  np.testing.assert_allclose(
    out, oracle.dense_reference(q, k, v, allowed), atol=1e-5
  )


def test_patterns_are_sparse_and_differ():
  """The test patterns are non-trivial: neither full nor equal."""
  s, f = strided_pattern(64, STRIDE), fixed_pattern(64, STRIDE, SUMMARY)
  assert 0.2 < s.mean() < 0.5 and 0.2 < f.mean() < 0.6
  assert (s != f).any()


def test_one_head_mixed_is_fixed():
  length = 30
  q, k, v = oracle.qkv(seed=2, length=length, heads=1, dim=D)
  out = run(make('mixed', heads=1), q, k, v)
  allowed = oracle.allowed_mask(pattern('fixed', length, heads=1))
  np.testing.assert_allclose(
    out, oracle.dense_reference(q, k, v, allowed), atol=1e-5
  )


@pytest.mark.parametrize('name', ['strided', 'fixed', 'mixed'])
def test_stride_covering_sequence_is_softmax(name):
  length = 37
  q, k, v = oracle.qkv(seed=3, length=length, heads=H, dim=D)
  pad = oracle.padding([length, 20], length)
  exact = run(
    oracle.make({'name': 'softmax'}, num_heads=H, head_dim=D), q, k, v, pad
  )
  out = run(make(name, stride=64, summary=8), q, k, v, pad)
  np.testing.assert_allclose(out, exact, atol=1e-5)


@pytest.mark.parametrize('name', ['strided', 'fixed'])
def test_causal_by_gradient(name):
  length = 40
  core = make(name)
  q, k, v = oracle.qkv(seed=4, length=length, heads=H, dim=D)
  pad = oracle.padding([length, 33], length)
  assert not depends_on_future(core, q, k, v, 19, pad)


def test_dropout_is_keyed():
  core = make('mixed', dropout_rate=0.5)
  q, k, v = oracle.qkv(seed=5, length=24, heads=H, dim=D)
  f = jax.jit(lambda key: core(q, k, v, oracle.Mask(), rngs=key)[0])
  a, b, c = (np.asarray(f(jax.random.key(s))) for s in (1, 1, 2))
  plain = run(core, q, k, v)
  assert np.abs(a - plain).max() > 1e-3
  assert np.abs(a - c).max() > 1e-3
  np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize('name', ['strided', 'fixed'])
@pytest.mark.parametrize('causal', [False, True])
def test_no_quadratic_intermediate(name, causal):
  """No array in the traced forward pass is anywhere near L x L."""
  length = 1024
  core = make(name, stride=32, summary=3, heads=1)
  q = jax.ShapeDtypeStruct((1, length, 1, D), jnp.float32)
  pad = jax.ShapeDtypeStruct((1, length), bool)
  jaxpr = jax.make_jaxpr(
    lambda q, k, v, pad: core(q, k, v, oracle.Mask(pad, causal))
  )(q, q, q, pad)
  sizes = [
    np.prod(var.aval.shape)
    for eqn in jaxpr.eqns
    for var in eqn.outvars
    if hasattr(var.aval, 'shape')
  ]
  assert max(sizes) <= length * length // 4, max(sizes)


def test_bfloat16_output_dtype():
  core = make('mixed', dtype=jnp.bfloat16)
  q, k, v = (
    t.astype(jnp.bfloat16)
    for t in oracle.qkv(seed=6, length=20, heads=H, dim=D)
  )
  out = jax.jit(lambda q, k, v, pad: core(q, k, v, oracle.Mask(pad))[0])(
    q, k, v, oracle.padding([20, 3], 20)
  )
  assert out.dtype == jnp.bfloat16
  assert np.isfinite(np.asarray(out, np.float32)).all()


@pytest.mark.parametrize(
  'opts, word',
  [
    ({'pattern': 'dilated'}, 'pattern'),
    ({'stride': 0}, 'stride'),
    ({'stride': 8, 'summary': 9}, 'summary'),
    ({'summary': -1}, 'summary'),
  ],
)
def test_bad_options_are_user_errors(opts, word):
  with pytest.raises(UserError, match=word):
    oracle.make({'name': 'sparse_transformer', **opts})


@pytest.mark.parametrize('name', ['strided', 'fixed'])
def test_memory_grows_as_l_sqrt_l(name):
  """Stride sqrt(L): about 8x from 1K to 4K (softmax's logits give 16x)."""
  small = core_memory_bytes(
    {'name': 'sparse_transformer', 'pattern': name, 'stride': 32}, 1024
  )
  large = core_memory_bytes(
    {'name': 'sparse_transformer', 'pattern': name, 'stride': 64}, 4096
  )
  assert large / small <= 8, (small, large)


# The shared suite's settings for this core (tests/test_attention_suite.py).
SUITE = dict(
  opts={'pattern': 'mixed', 'stride': 8, 'summary': 3},
  exact=None,
  identity='its patterns against the dense oracle, this file',
  # Rotary (tests/test_positions.py): softmax at stride >= L.
  rotary_opts={'pattern': 'mixed', 'stride': 64, 'summary': 3},
)


def test_merged_is_the_union_of_the_parts():
  """The oracle's parts: their union is the merged pattern, neither part
  alone is (so the combine tests below can fail)."""
  for name in ('strided', 'fixed'):
    a1, a2 = parts(name, 64)
    union = pattern(name, 64, heads=1)[0]
    np.testing.assert_array_equal(a1 | a2, union)
    assert (a1 != union).any() and (a2 != union).any() and (a1 != a2).any()
  np.testing.assert_array_equal(
    combined_pattern('mixed', 'merged', 37), pattern('mixed', 37)
  )


@pytest.mark.parametrize('name', ['strided', 'fixed', 'mixed'])
@pytest.mark.parametrize(
  'combine, layer', [('interleaved', 0), ('interleaved', 1), ('heads', 0)]
)
@pytest.mark.parametrize('causal', [False, True])
def test_combine_matches_dense_pattern(name, combine, layer, causal):
  length = 37
  core = make(name, combine=combine, layer_index=layer)
  q, k, v = oracle.qkv(seed=11, length=length, heads=H, dim=D)
  pad = oracle.padding([length, length - 9], length)
  out = run(core, q, k, v, pad, causal)
  allowed = oracle.allowed_mask(
    combined_pattern(name, combine, length, layer), pad, causal
  )
  np.testing.assert_allclose(
    out, oracle.dense_reference(q, k, v, allowed), atol=1e-5
  )


@pytest.mark.parametrize(
  'combine, layer', [('interleaved', 4), ('interleaved', 7), ('heads', 1)]
)
def test_combine_follows_layer_parity(combine, layer):
  """Layers 4 and 7 attend like 0 and 1; heads ignores the layer."""
  length = 30
  q, k, v = oracle.qkv(seed=12, length=length, heads=H, dim=D)
  out = run(make('fixed', combine=combine, layer_index=layer), q, k, v)
  allowed = oracle.allowed_mask(
    combined_pattern('fixed', combine, length, layer)
  )
  np.testing.assert_allclose(
    out, oracle.dense_reference(q, k, v, allowed), atol=1e-5
  )


def test_fixed_summary_alone_keeps_a_stride_beyond_the_length():
  """Fixed A(2) with l > L sees j mod l >= l - c that exist (56 .. 59 at
  l = 64, c = 8, L = 60), not the last c positions of a clamped block;
  causal, queries before 56 see nothing and output zeros."""
  length, stride, summary = 60, 64, 8
  core = make(
    'fixed',
    stride=stride,
    summary=summary,
    combine='interleaved',
    layer_index=1,
  )
  q, k, v = oracle.qkv(seed=13, length=length, heads=H, dim=D)
  for causal in (False, True):
    out = run(core, q, k, v, None, causal)
    a2 = parts('fixed', length, stride, summary)[1]
    assert a2.sum() == 4 * length
    allowed = oracle.allowed_mask(a2, None, causal)
    np.testing.assert_allclose(
      out, oracle.dense_reference(q, k, v, allowed), atol=1e-5
    )
  np.testing.assert_array_equal(out[:, :56], 0.0)


def test_heads_dropout_is_keyed():
  """One dropout key per head group, drawn from the call's key."""
  core = make('fixed', combine='heads', dropout_rate=0.5)
  q, k, v = oracle.qkv(seed=14, length=16, heads=H, dim=D)
  f = jax.jit(lambda key: core(q, k, v, oracle.Mask(), rngs=key)[0])
  a, b, c = (np.asarray(f(jax.random.key(s))) for s in (1, 1, 2))
  np.testing.assert_array_equal(a, b)
  assert np.abs(a - c).max() > 1e-3
  # Both groups (heads 0-1: A(1), 2-3: A(2)) are dropped out.
  plain = run(core, q, k, v)
  for group in (slice(0, 2), slice(2, 4)):
    assert np.abs(a[:, :, group] - plain[:, :, group]).max() > 1e-3


def test_only_interleaved_depends_on_the_layer():
  """scan_layers stacks alike cores: merged and heads are alike in every
  layer; interleaved's even and odd layers differ (its scan is refused)."""

  def graph(combine, layer):
    return nnx.graphdef(make('mixed', combine=combine, layer_index=layer))

  for combine in ('merged', 'heads'):
    assert graph(combine, 0) == graph(combine, 1)
  assert graph('interleaved', 0) == graph('interleaved', 2)
  assert graph('interleaved', 0) != graph('interleaved', 1)


@pytest.mark.parametrize(
  'opts, word',
  [
    ({'combine': 'union'}, 'combine'),
    ({'combine': 'heads', 'pattern': 'mixed', 'num_heads': 2}, 'heads'),
    ({'combine': 'heads', 'pattern': 'fixed', 'num_heads': 1}, 'heads'),
  ],
)
def test_bad_combine_is_a_user_error(opts, word):
  heads = opts.pop('num_heads', H)
  with pytest.raises(UserError, match=word):
    oracle.make({'name': 'sparse_transformer', **opts}, num_heads=heads)


@pytest.mark.parametrize('name', ['strided', 'fixed'])
@pytest.mark.parametrize('combine', ['heads', 'interleaved'])
def test_parts_have_no_quadratic_intermediate(name, combine):
  length = 1024
  core = make(name, stride=32, summary=3, heads=2, combine=combine)
  core_odd = make(
    name, stride=32, summary=3, heads=2, combine=combine, layer_index=1
  )
  q = jax.ShapeDtypeStruct((1, length, 2, D), jnp.float32)
  pad = jax.ShapeDtypeStruct((1, length), bool)
  for c in (core, core_odd):
    jaxpr = jax.make_jaxpr(
      lambda q, k, v, pad, c=c: c(q, k, v, oracle.Mask(pad, True))
    )(q, q, q, pad)
    sizes = [
      np.prod(var.aval.shape)
      for eqn in jaxpr.eqns
      for var in eqn.outvars
      if hasattr(var.aval, 'shape')
    ]
    assert max(sizes) <= length * length // 4, max(sizes)
