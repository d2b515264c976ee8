"""configs/s5_reference.py: the S5 paper's LRA values over each task's s5
config. Every flattened key must exist in the locked `configs/<task>.py:s5`
config (a misspelt key fails), the values must pass train.py's config
checks and reach the built model, the counts must follow from the script
numbers in S5_RUN, and the train step must trace (jax.eval_shape) with the
real values at a batch of 2 and one layer (every layer: -m slow)."""

import importlib

from flax import nnx
import jax
import jax.numpy as jnp
import pytest

from configs.s5_reference import S5_NOT_EXPRESSED, S5_REFERENCE, S5_RUN
from lra import data as tasks
from lra.train import build, steps, validate

TASKS = ('listops', 'text', 'retrieval', 'image', 'pathfinder', 'pathx')


def s5_config(task):
  return importlib.import_module(f'configs.{task}').get_config('s5')


def set_flat(config, dotted, value):
  """config[dotted] = value; AssertionError naming a key the config lacks."""
  *parents, leaf = dotted.split('.')
  node = config
  for i, part in enumerate(parents):
    where = '.'.join(parents[:i]) or 'the config'
    assert part in node, f'{dotted}: no {part!r} in {where}'
    node = node[part]
  assert leaf in node, f'{dotted}: not a config key'
  node[leaf] = value
  assert node[leaf] == value, dotted


def reference_config(task):
  c = s5_config(task)
  for key, value in S5_REFERENCE[task].items():
    set_flat(c, key, value)
  return c


def test_every_task_and_only_tasks():
  assert set(S5_REFERENCE) == set(TASKS)
  assert set(S5_RUN) == set(TASKS) == set(S5_NOT_EXPRESSED)


def test_a_misspelt_key_fails():
  c = s5_config('listops')
  with pytest.raises(AssertionError, match='not a config key'):
    set_flat(c, 'model.attention.state_sise', 16)
  with pytest.raises(AssertionError, match="no 'modle'"):
    set_flat(c, 'modle.num_layers', 2)


@pytest.mark.parametrize('task', TASKS)
def test_counts_follow_from_the_scripts(task):
  ref, run = S5_REFERENCE[task], S5_RUN[task]
  per_epoch = run['train_size'] // run['bsz']
  assert ref['batch_size'] == run['bsz']
  assert ref['num_train_steps'] == run['epochs'] * per_epoch
  assert ref['warmup_steps'] == run['warmup_end'] * per_epoch
  assert ref['eval_every_steps'] == per_epoch
  lr = run['lr_factor'] * run['ssm_lr_base']
  assert ref['learning_rate'] == pytest.approx(lr, rel=1e-9)
  # P holds conjugate pairs in each of the J blocks.
  p, j = ref['model.attention.state_size'], ref['model.attention.blocks']
  assert p % (2 * j) == 0


@pytest.mark.parametrize('task', TASKS)
def test_values_apply_and_pass_the_config_checks(task):
  c = reference_config(task)  # every key exists, with the real values
  ref = S5_REFERENCE[task]
  # train.py's checks (ranges, options). The devices must divide the batch:
  # the authors' 50 runs on 1, 2, 5 or 10 devices, not on these tests' 4,
  # so the check sees the largest multiple of the device count below it.
  n = jax.device_count()
  c.batch_size = max(n, ref['batch_size'] // n * n)
  validate.check_config(c)


def _train_shapes(config):
  """(model, loss, metrics shapes): the train step traced with
  jax.eval_shape (no compilation)."""
  task = tasks.get_task(config.task)
  graphdef, state = build.create_state(config, task, None)
  lead = (config.batch_size,) + ((2,) if task.num_inputs == 2 else ())
  batch = {
    'inputs': jax.ShapeDtypeStruct(lead + (config.max_length,), jnp.int32),
    'labels': jax.ShapeDtypeStruct((config.batch_size,), jnp.int32),
    'weights': jax.ShapeDtypeStruct((config.batch_size,), jnp.float32),
  }
  step = steps.make_train_step(graphdef)
  model, _ = nnx.merge(graphdef, state)
  return model, jax.eval_shape(step, state, batch, jax.random.key(0))


def check_model(model, ref, num_layers):
  """The built model is the SSM block around the s5 mixer, as configured."""
  assert len(model.encoder.blocks) == num_layers
  assert not model.encoder.use_cls  # mean pooling: no CLS token
  for block in model.encoder.blocks:
    assert block.norm_kind == 'batch' and block.prenorm
    assert block.dropout_rate == ref['model.dropout_rate']
    mixer = block.attn.mixer
    assert (mixer.p, mixer.blocks, mixer.emb_dim) == (
      ref['model.attention.state_size'],
      ref['model.attention.blocks'],
      ref['model.emb_dim'],
    )
    assert mixer.activation == 'glu' and mixer.bidirectional
    assert mixer.dt_min == ref['model.attention.dt_min']
    assert mixer.dropout_rate == ref['model.attention_dropout_rate']


@pytest.mark.parametrize('task', TASKS)
def test_model_builds_and_train_step_traces(task):
  """The real values at one layer and a batch of 2 (for speed: compiling
  the initialisers dominates on a shared CPU); width, length, P and J are
  the paper's. The full depth: the slow test below."""
  c = reference_config(task)
  c.batch_size, c.model.num_layers = 2, 1
  model, (_, metrics) = _train_shapes(c)
  check_model(model, S5_REFERENCE[task], 1)
  assert metrics['loss'].shape == ()


@pytest.mark.slow
@pytest.mark.parametrize('task', TASKS)
def test_full_depth_traces(task):
  c = reference_config(task)
  c.batch_size = 2
  ref = S5_REFERENCE[task]
  model, (_, metrics) = _train_shapes(c)
  check_model(model, ref, ref['model.num_layers'])
  assert metrics['loss'].shape == ()
