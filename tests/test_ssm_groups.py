"""The state-space parameter group (config.ssm_learning_rate,
ssm_weight_decay; lra/train/steps.py make_optimizer): the S4/S5/Mamba
authors' recipe of a separate rate and no weight decay for A, B, dt."""

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import listops as listops_config
from lra import data as tasks
from lra.train import steps
from lra.train.build import build_model

GROUPED = ('s4d', 's5', 'mamba', 'mamba2', 'h3')


def model_and_config(name, **changes):
  config = listops_config.get_config(f'{name},smoke')
  config.update_from_flattened_dict(changes)
  return build_model(config, tasks.get_task('listops')), config


def leaves_with_keys(params):
  flat = jax.tree_util.tree_flatten_with_path(params)[0]
  return [(steps.parameter_key(p), a) for p, a in flat]


@pytest.mark.parametrize('name', GROUPED)
def test_every_listed_parameter_is_found_in_the_optimised_state(name):
  model, _ = model_and_config(name)
  paths = steps.ssm_parameter_paths(model)
  assert paths, f'{name} lists no state-space parameters'
  keys = {k for k, _ in leaves_with_keys(nnx.state(model, nnx.Param))}
  assert paths <= keys, sorted(paths - keys)[:3]


def test_the_transformer_has_no_group_and_keeps_plain_adamw():
  model, config = model_and_config('transformer', ssm_learning_rate=1e-4)
  assert not steps.ssm_parameter_paths(model)
  plain = steps.make_optimizer(config)
  params = nnx.state(model, nnx.Param)
  same = jax.tree.structure(plain.init(params))
  assert same == jax.tree.structure(
    steps.make_optimizer(config, model).init(params)
  )


def run_updates(tx, params, n=3):
  state = tx.init(params)
  key = jax.random.key(0)
  out = []
  for _ in range(n):
    key, sub = jax.random.split(key)
    leaves, treedef = jax.tree.flatten(params)
    subs = jax.random.split(sub, len(leaves))
    grads = jax.tree.unflatten(
      treedef,
      [jax.random.normal(k, a.shape, a.dtype) for k, a in zip(subs, leaves)],
    )
    updates, state = tx.update(grads, state, params)
    out.append(updates)
  return out, state


def test_groups_at_the_same_rate_and_decay_equal_plain_adamw():
  model, config = model_and_config('s4d', learning_rate=1e-3, weight_decay=0.05)
  params = nnx.state(model, nnx.Param)
  plain, plain_state = run_updates(steps.make_optimizer(config), params)
  config.ssm_learning_rate, config.ssm_weight_decay = 1e-3, 0.05
  grouped, grouped_state = run_updates(
    steps.make_optimizer(config, model), params
  )
  # The same state structure: a run resumes with the groups on or off.
  assert jax.tree.structure(plain_state) == jax.tree.structure(grouped_state)
  for a, b in zip(plain, grouped):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
      np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-12)


def test_the_group_takes_its_own_rate_and_no_decay():
  model, config = model_and_config('s5', learning_rate=1e-3, weight_decay=0.05)
  params = nnx.state(model, nnx.Param)
  paths = steps.ssm_parameter_paths(model)
  config.ssm_learning_rate, config.ssm_weight_decay = 2.5e-4, 0.0
  grouped, _ = run_updates(steps.make_optimizer(config, model), params)
  plain, _ = run_updates(steps.make_optimizer(config), params)
  config.weight_decay = 0.0
  undecayed, _ = run_updates(steps.make_optimizer(config), params)
  seen = 0
  for g, p, u in zip(grouped, plain, undecayed):
    for (k, x), (_, y), (_, z) in zip(
      leaves_with_keys(g), leaves_with_keys(p), leaves_with_keys(u)
    ):
      if k in paths:
        seen += 1
        np.testing.assert_allclose(x, 0.25 * z, rtol=1e-5, atol=1e-12)
      else:
        np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-12)
  assert seen == 3 * len(paths)


def test_a_negative_rate_is_refused_in_one_sentence():
  from lra.errors import UserError
  from lra.train import validate

  config = listops_config.get_config('s4d,smoke')
  config.ssm_learning_rate = -1.0
  with pytest.raises(UserError, match='ssm_learning_rate'):
    validate.check_config(config)


def test_jitted_step_uses_the_group():
  """Through nnx.Optimizer as training builds it: one step moves a grouped
  parameter by the group's rate (Adam's step is lr x sign(g) for a
  constant gradient)."""
  model, config = model_and_config(
    'mamba',
    learning_rate=1e-2,
    warmup_steps=0,
    schedule='constant',
    weight_decay=0.0,
  )
  config.ssm_learning_rate = 1e-4
  opt = nnx.Optimizer(model, steps.make_optimizer(config, model), wrt=nnx.Param)
  before = nnx.state(model, nnx.Param)
  before = jax.tree.map(jnp.copy, before)
  grads = jax.tree.map(jnp.ones_like, before)
  opt.update(model, grads)  # the schedule's rate at step 0 is 0
  opt.update(model, grads)
  after = nnx.state(model, nnx.Param)
  paths = steps.ssm_parameter_paths(model)
  for (k, a), (_, b) in zip(leaves_with_keys(before), leaves_with_keys(after)):
    step = float(jnp.max(jnp.abs(a - b)))
    want = 1e-4 if k in paths else 1e-2
    assert step == pytest.approx(want, rel=1e-3), k
