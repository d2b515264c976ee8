"""The contract, checked on every registered sequence mixer (models/mixers/).

Enumerated from the registry, so a new mixer is tested without editing this
file: padding invariance (changing padded inputs changes no real output),
zeros for an all-padded example, finite gradients, causality by gradient (or
a one-sentence refusal), bfloat16 under jit, one training step of a model
around it on ListOps smoke, and compiled training-step memory that grows
about linearly from 1K to 4K (XLA's analysis). The softmax exact limit of
the attention suite is replaced by each mixer's own reference, its
recurrence step by step in float64 numpy, in tests/test_mixer_<name>.py,
which may define a module-level dict `SUITE` with `opts` (the options these
runs use; default: the mixer's defaults).
"""

import importlib

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lra import data as tasks
from lra.errors import UserError
from lra.train import steps
from models.attention import Mask, known_cores
from models.attention.memory import compiled_memory
from models.attention.registry import get_core_class, is_mixer
from models.layers import MixerSublayer

B, L, E = 2, 37, 16
LENGTHS = (L, 20)


def mixer_names():
  return sorted(n for n in known_cores() if is_mixer(get_core_class(n)))


def suite_opts(name):
  """opts of tests/test_mixer_<name>.py's SUITE, else {}."""
  try:
    module = importlib.import_module(f'test_mixer_{name}')
  except ModuleNotFoundError as e:
    if e.name != f'test_mixer_{name}':
      raise
    return {}
  return dict(getattr(module, 'SUITE', {}).get('opts', {}))


MIXERS = mixer_names()


def make(name, dtype=jnp.float32, **kw):
  """The mixer in its sub-layer (padding zeroed as the blocks do)."""
  return MixerSublayer(
    E,
    2,
    {'name': name, **suite_opts(name), **kw},
    max_length=128,
    dropout_rate=0.0,
    dtype=dtype,
    rngs=nnx.Rngs(0),
  )


def inputs(seed, length=L):
  return jax.random.normal(jax.random.key(seed), (B, length, E))


def padding(lengths, length=L):
  return jnp.arange(length)[None, :] < jnp.asarray(lengths)[:, None]


def apply(layer, x, pad, causal=False):
  graphdef, state = nnx.split(layer)

  @jax.jit
  def f(state, x, pad):
    return nnx.merge(graphdef, state)(x, Mask(pad, causal))[0]

  return f(state, x, pad)


def test_the_mixers_are_registered():
  assert {'s4d', 's5', 'mamba'} <= set(MIXERS), MIXERS


@pytest.mark.parametrize('name', MIXERS)
def test_padding_invariance_and_zero_rows(name):
  layer = make(name)
  pad = padding(LENGTHS)
  x = inputs(1)
  noise = 50 * inputs(2)
  x2 = jnp.where(pad[:, :, None], x, noise)
  for causal in (False, True) if layer.mixer.supports_causal else (False,):
    out1 = np.asarray(apply(layer, x, pad, causal))
    out2 = np.asarray(apply(layer, x2, pad, causal))
    real = np.asarray(pad)
    np.testing.assert_allclose(out1[real], out2[real], atol=1e-5)
    assert np.abs(out1[real]).max() > 1e-3  # not trivially zero
    np.testing.assert_array_equal(out1[~real], 0.0)
  empty = np.asarray(apply(layer, x, padding((L, 0))))
  assert np.isfinite(empty).all()
  np.testing.assert_array_equal(empty[1], 0.0)


@pytest.mark.parametrize('name', MIXERS)
def test_finite_gradients_and_causality(name):
  layer = make(name)
  pad = padding(LENGTHS)
  graphdef, state = nnx.split(layer)
  if not layer.mixer.supports_causal:
    with pytest.raises(UserError, match=name):
      apply(layer, inputs(3), pad, True)
    return

  def out_t(x, t, causal):
    y = nnx.merge(graphdef, state)(x, Mask(pad, causal))[0]
    return jnp.sum(y[0, t] ** 2)

  x = inputs(3)
  grad_t = jax.jit(jax.grad(out_t), static_argnums=2)
  for t in (0, 9, 19):
    g = np.asarray(grad_t(x, t, True))
    assert np.isfinite(g).all()
    # Nothing after t (an FFT convolution leaks rounding error only).
    assert np.abs(g[0, t + 1 :]).max() <= 1e-5 * np.abs(g[0]).max(), t
    if t:
      assert np.abs(g[0, :t]).sum() > 0  # the past does matter
  # Bidirectional: the first output sees the future.
  g = np.asarray(grad_t(x, 0, False))
  assert np.isfinite(g).all() and np.abs(g[0, 1:20]).sum() > 0
  # Parameters' gradients are finite too.
  graphdef_p, params, rest = nnx.split(layer, nnx.Param, ...)

  def loss(params):
    merged = nnx.merge(graphdef_p, params, rest)
    return jnp.sum(merged(x, Mask(pad, False))[0] ** 2)

  for leaf in jax.tree.leaves(jax.jit(jax.grad(loss))(params)):
    assert np.isfinite(np.asarray(leaf)).all()


@pytest.mark.parametrize('name', MIXERS)
def test_bfloat16_and_jit(name):
  pad = padding(LENGTHS)
  x = inputs(4)
  ref = np.asarray(apply(make(name), x, pad))
  out = apply(make(name, jnp.bfloat16), x.astype(jnp.bfloat16), pad)
  assert out.dtype == jnp.bfloat16
  out = np.asarray(out, np.float32)
  assert np.isfinite(out).all()
  scale = np.abs(ref).max()
  assert np.abs(out - ref).max() < 0.1 * scale + 0.05, name


@pytest.fixture(scope='module')
def listops_smoke(tmp_path_factory):
  path = str(tmp_path_factory.mktemp('data'))
  tasks.get_task('listops').ensure_prepared(path, {'variant': 'smoke'}, False)
  return path


def smoke_config(name, **overrides):
  c = importlib.import_module('configs.listops').get_config(f'{name},smoke')
  for key, value in overrides.items():
    *parents, leaf = key.split('.')
    node = c
    for p in parents:
      node = node[p]
    node[leaf] = value
  return c


# tests/test_options.py already trains every core one smoke step; here s5
# also checks its block's BatchNorm statistics (the others: -m slow).
@pytest.mark.parametrize(
  'name',
  [
    pytest.param(n, marks=() if n == 's5' else pytest.mark.slow) for n in MIXERS
  ],
)
def test_trains_one_step_on_listops_smoke(name, listops_smoke):
  """A model around the mixer (the model name is the mixer's name) takes
  training steps on real ListOps batches: finite loss, parameters move."""
  # s5 in the S5 paper's block (its recipe: model.block=ssm, batch norm):
  # its running statistics move too; the others in the transformer block.
  config = smoke_config(name, data_dir=listops_smoke)
  ssm = config.model.block == 'ssm' and config.model.norm == 'batch'
  task = tasks.get_task('listops')
  from lra.train import batching, build, runtime  # pylint: disable=g-import-not-at-top

  graphdef, state = build.create_state(config, task, None)
  data = runtime.load_data(config, task, progress=False)
  step = steps.make_train_step(graphdef)
  floats = lambda s: [  # noqa: E731
    np.asarray(a, np.float32)
    for a in jax.tree.leaves(s)
    if hasattr(a, 'dtype') and jnp.issubdtype(a.dtype, jnp.floating)
  ]
  before = floats(state)  # the step donates the state: copied first
  batch = batching.training_batch(config, task, data, [], 0)
  batch = {k: jnp.asarray(v) for k, v in batch.items()}
  new_state, metrics = step(state, batch, jax.random.key(0))
  assert np.isfinite(float(metrics['loss']))
  moved = [np.abs(a - b).max() for a, b in zip(before, floats(new_state))]
  assert max(moved) > 0
  if ssm:
    stats = nnx.state(nnx.merge(graphdef, new_state)[0], nnx.BatchStat)
    means = [v for p, v in jax.tree.leaves_with_path(stats) if 'mean' in str(p)]
    assert means and max(np.abs(np.asarray(m)).max() for m in means) > 0


def step_memory(name, length):
  """Peak bytes of jit(grad) of the mixer sub-layer at `length` (batch 1,
  width 32): abstract inputs, nothing allocated."""
  layer = MixerSublayer(
    32,
    2,
    {'name': name, **suite_opts(name)},
    max_length=length,
    dropout_rate=0.0,
    dtype=jnp.float32,
    rngs=nnx.Rngs(0),
  )
  graphdef, state = nnx.split(layer)

  def loss(state, x, pad):
    return jnp.sum(nnx.merge(graphdef, state)(x, Mask(pad, False))[0])

  x = jax.ShapeDtypeStruct((1, length, 32), jnp.float32)
  pad = jax.ShapeDtypeStruct((1, length), jnp.bool_)
  compiled = jax.jit(jax.grad(loss)).lower(state, x, pad).compile()
  return compiled_memory(compiled)['peak']


@pytest.mark.parametrize('name', MIXERS)
def test_memory_grows_about_linearly(name):
  small, large = step_memory(name, 1024), step_memory(name, 4096)
  assert large / small <= 5.0, (small, large)  # quadratic would be ~16
