"""Longformer: window/dilation/global pattern against the dense oracle."""

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import listops
from lra import data as tasks
from lra.errors import UserError
from models.attention import Mask
from models.attention.longformer import LongformerAttention
from models.attention.memory import core_memory_bytes
from models.classifier import build_model
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


# ------------------------------------------ the paper's variants (issue #21)
def variant_pattern(length, window, dilations, glob):
  """bool[H, L, L]: window per layer, dilation per head, global positions P
  (i or j in P), written out from the definition."""
  i = np.arange(length)[:, None]
  j = np.arange(length)[None, :]
  is_glob = np.isin(np.arange(length), glob)
  heads = []
  for d in dilations:
    band = (np.abs(i - j) <= (window // 2) * d) & ((i - j) % d == 0)
    heads.append(band | is_glob[None, :] | is_glob[:, None])
  return np.stack(heads)


def check_variant(core, length, dilations, glob, causal=False, seed=0):
  q, k, v = qkv(seed=seed, length=length, heads=H, dim=D)
  pad = padding([length, length - 9], length)
  out = call(core, q, k, v, pad, causal)
  pattern = variant_pattern(length, core.window, dilations, glob)
  assert not pattern.all()  # genuinely sparse
  allowed = allowed_mask(pattern, pad, causal)
  np.testing.assert_allclose(out, dense_reference(q, k, v, allowed), atol=1e-5)


def test_window_per_layer_from_a_list_matches_dense_pattern():
  for layer, want in enumerate((4, 10, 6)):
    core = make(
      {'name': 'longformer', 'window': '4,10,6', 'global_positions': ''},
      num_heads=H,
      head_dim=D,
      layer_index=layer,
    )
    assert core.window == want
    check_variant(core, 30, (1, 1), [], causal=layer == 1, seed=layer)
  with pytest.raises(UserError, match='lists 3 sizes .* layer 3') as e:
    make({'name': 'longformer', 'window': '4,10,6'}, layer_index=3)
  assert str(e.value).replace('e.g. ', '').count('. ') == 0


def test_window_growth_doubles_per_layer():
  opts = {'name': 'longformer', 'window': 4, 'window_growth': 2.0}
  windows = [make(opts, layer_index=i).window for i in range(4)]
  assert windows == [4, 8, 16, 32]
  grown = {**opts, 'window_growth': 1.5, 'global_positions': '3'}
  core = make(grown, num_heads=H, head_dim=D, layer_index=2)
  assert core.window == 8  # 2 * round(4 * 2.25 / 2)
  check_variant(core, 33, (1, 1), [3])
  assert make({'name': 'longformer', 'window': 6}, layer_index=5).window == 6
  with pytest.raises(UserError, match='window_growth must stay 1.0'):
    make({**opts, 'window': '4,8'}, layer_index=0)
  with pytest.raises(UserError, match='window_growth must be a number > 0'):
    make({**opts, 'window_growth': 0.0})


def test_dilation_per_head_and_global_positions_match_dense_pattern():
  core = longformer(window=4, dilation='1,3', global_positions='2,17,50')
  assert core.dilations == (1, 3) and core.global_positions == (2, 17, 50)
  check_variant(core, 40, (1, 3), [2, 17])  # 50 >= L is ignored
  # With the global projections (identity at initialisation): the same.
  core = longformer(
    window=4, dilation=[2, 1], global_positions=30, global_projections=True
  )
  check_variant(core, 40, (2, 1), [30], seed=1)  # 30 is padding in row 1


def test_dilation_per_head_causal_matches_dense_pattern():
  core = longformer(window=6, dilation='3,1', global_positions='')
  check_variant(core, 37, (3, 1), [], causal=True, seed=2)


def test_command_line_strings_parse_like_values():
  a = longformer(window='8', dilation='2', global_positions='0, 5')
  b = longformer(window=8, dilation=2, global_positions=[5, 0, 5])
  assert (a.window, a.dilations, a.global_positions) == (8, (2, 2), (0, 5))
  assert (b.window, b.dilations, b.global_positions) == (8, (2, 2), (0, 5))
  for none in ('', 'none', []):
    assert longformer(global_positions=none).global_positions == ()
  assert longformer(global_tokens='3').global_positions == (0, 1, 2)
  assert longformer().global_positions == (0,)  # 'auto' outside a model


@pytest.mark.parametrize(
  'opts, match',
  [
    ({'dilation': '1,2,2'}, 'dilation lists 3 values but the model has 2'),
    ({'dilation': '1,x'}, 'dilation must be an integer >= 1'),
    ({'global_positions': '0,-1'}, 'global_positions must be an integer'),
    ({'global_positions': 'cls'}, 'global_positions must be an integer'),
    ({'global_tokens': 1, 'global_positions': '0'}, 'both name'),
    ({'window': '8,9'}, 'window must be an even integer'),
  ],
)
def test_bad_variant_options_are_one_sentence(opts, match):
  with pytest.raises(UserError, match=match) as e:
    longformer(**opts)
  assert str(e.value).replace('e.g. ', '').count('. ') == 0


def test_auto_global_positions_follow_the_pooling():
  resolve = LongformerAttention.model_options
  auto = {'name': 'longformer', 'global_positions': 'auto'}
  assert resolve(auto, pooling='cls', causal=False)['global_positions'] == '0'
  assert resolve(auto, pooling='first', causal=False)['global_positions'] == '0'
  for pooling in ('mean', 'max'):
    out = resolve(auto, pooling=pooling, causal=False)
    assert out['global_positions'] == ''
  assert resolve(auto, pooling='cls', causal=True)['global_positions'] == ''
  for explicit in ({'global_positions': '4'}, {'global_tokens': 2}):
    opts = {'name': 'longformer', **explicit}
    assert resolve(opts, pooling='mean', causal=False) == opts


@pytest.mark.parametrize('pooling, want', [('cls', (0,)), ('mean', ())])
def test_model_build_resolves_auto_global_positions(pooling, want):
  """The classifier's cores: the CLS global with CLS pooling, nothing with
  mean pooling (no global projections then); the config is unchanged."""
  config = listops.get_config('longformer,smoke')
  config.model.pooling = pooling
  model = build_model(config, tasks.get_task('listops'))
  core = model.encoder.blocks[0].attn.core
  assert core.global_positions == want
  assert bool(nnx.state(core, nnx.Param)) == bool(want)
  assert config.model.attention.global_positions == 'auto'


# The shared suite's settings for this core (tests/test_attention_suite.py).
SUITE = dict(
  opts={'window': 8, 'global_tokens': 2},
  exact={'window': 74, 'global_tokens': 0, 'global_projections': False},
  causal={'window': 8, 'global_tokens': 0},
)
