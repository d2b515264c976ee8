"""model.remat and model.scan_layers: the plain model's loss and gradients
(with dropout on: the same keys reach the same layers), less compiled
memory with remat, one sentence where they do not apply."""

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import listops as listops_config
from lra import data as tasks
from lra.errors import UserError
from models.classifier import build_model


def smoke_config(**model):
  config = listops_config.get_config('transformer,smoke')
  config.model.update(model)
  return config


def loss_and_grads(config, tokens_BxL, labels_B):
  """(loss, grads, model) of a fresh model (seed 0), dropout on."""
  model = build_model(config, tasks.get_task('listops'))
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)

  @jax.jit
  def f(params):
    model = nnx.merge(graphdef, params, rest)
    logits_BxC, aux = model(tokens_BxL, key=jax.random.key(3))
    log_p = jax.nn.log_softmax(logits_BxC)
    loss = -jnp.mean(jnp.take_along_axis(log_p, labels_B[:, None], 1))
    return loss + aux['aux_loss']

  loss, grads = jax.value_and_grad(f)(params)
  return loss, grads, params


def blocks_stacked(state):
  """The plain layout's per-block leaves stacked as scan_layers holds them."""
  state = nnx.to_pure_dict(state)
  blocks = state['encoder']['blocks']
  state['encoder']['blocks'] = jax.tree.map(
    lambda *xs: np.stack(xs), *[blocks[i] for i in sorted(blocks)]
  )
  return state


@pytest.fixture(scope='module')
def batch():
  rng = np.random.default_rng(0)
  tokens_BxL = jnp.asarray(rng.integers(1, 15, (4, 64)), jnp.int32)
  return tokens_BxL, jnp.asarray(rng.integers(0, 10, (4,)), jnp.int32)


@pytest.fixture(scope='module')
def plain(batch):
  return loss_and_grads(smoke_config(num_layers=2), *batch)


@pytest.mark.parametrize(
  'options',
  [
    {'remat': True},
    {'scan_layers': True},
    {'scan_layers': True, 'remat': True},
  ],
)
def test_same_loss_and_gradients_as_the_plain_model(plain, batch, options):
  loss, grads, params = loss_and_grads(
    smoke_config(num_layers=2, **options), *batch
  )
  loss0, grads0, params0 = plain
  np.testing.assert_allclose(loss, loss0, rtol=1e-6)
  if options.get('scan_layers'):
    # Stacked layout: blocks.<leaf> is [2, ...]; map the plain one onto it.
    params0, grads0 = blocks_stacked(params0), blocks_stacked(grads0)
    params, grads = nnx.to_pure_dict(params), nnx.to_pure_dict(grads)
    leaf = params['encoder']['blocks']['mlp']['fc1']['kernel']
    assert leaf.shape[0] == 2
  same = jax.tree.map(np.array_equal, params, params0)
  assert all(jax.tree.leaves(same))  # the same initial parameters
  flat, flat0 = jax.tree.leaves(grads), jax.tree.leaves(grads0)
  assert len(flat) == len(flat0) and jax.tree.structure(
    jax.tree.map(np.shape, grads)
  ) == jax.tree.structure(jax.tree.map(np.shape, grads0))
  for g, g0 in zip(flat, flat0):
    np.testing.assert_allclose(g, g0, rtol=1e-4, atol=1e-6)


def compiled_temp_bytes(config, batch):
  model = build_model(config, tasks.get_task('listops'))
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)

  def f(params, tokens_BxL):
    logits, _ = nnx.merge(graphdef, params, rest)(tokens_BxL, key=None)
    return jnp.sum(logits)

  compiled = jax.jit(jax.grad(f)).lower(params, batch).compile()
  return compiled.memory_analysis().temp_size_in_bytes


def test_remat_compiles_to_less_memory_at_depth_6():
  """With scanned layers remat cuts the compiled memory several-fold. (The
  unrolled blocks' remat is no smaller on XLA:CPU, whose scheduler moves
  the recomputation early; measured in the README's scaling table.)"""
  tokens_BxL = jnp.ones((8, 64), jnp.int32)
  scan = compiled_temp_bytes(
    smoke_config(num_layers=6, scan_layers=True), tokens_BxL
  )
  remat = compiled_temp_bytes(
    smoke_config(num_layers=6, scan_layers=True, remat=True), tokens_BxL
  )
  assert remat < 0.5 * scan, (remat, scan)


def test_where_they_do_not_apply_one_sentence():
  task = tasks.get_task('listops')
  with pytest.raises(UserError, match='Reversible blocks already'):
    build_model(smoke_config(reversible=True, remat=True), task)
  config = smoke_config(scan_layers=True)
  config.model.attention = {'name': 'transformer_xl'}
  with pytest.raises(UserError, match='segment_remat=True instead'):
    build_model(config, task)
