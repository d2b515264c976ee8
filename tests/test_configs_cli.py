"""The config from the command line: train.py --print_config (every field
under its comment), --help naming where fields are documented, and list
options (longformer's per-layer window) parsed as tuples of their type."""

import json
import os
import subprocess
import sys

from flax import nnx
import jax
import numpy as np
import pytest

from lra import data as tasks
from lra.errors import UserError
from lra.train import batching, build, cli, comments, runtime, steps
from lra.train import options as model_configs
from models.attention.longformer import LongformerAttention

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEXT = os.path.join(ROOT, 'configs', 'text.py')
WINDOW = '--config.model.attention.window'


def train_py(*args, cwd):
  return subprocess.run(
    [sys.executable, os.path.join(ROOT, 'train.py'), *args],
    cwd=cwd,
    capture_output=True,
    text=True,
    timeout=300,
  )


def smoke_argv(*overrides, model='longformer'):
  return ['train.py', f'--config=configs/listops.py:{model},smoke', *overrides]


# ------------------------------------------------------------ --print_config
def test_print_config_prints_every_field_with_its_comment(tmp_path):
  workdir = tmp_path / 'never'
  proc = train_py(
    f'--config={TEXT}:longformer,small',
    '--print_config',
    f'--workdir={workdir}',  # given or not, nothing is created
    f'{WINDOW}=8,16',
    cwd=tmp_path,
  )
  assert proc.returncode == 0, proc.stderr
  assert os.listdir(tmp_path) == []  # no workdir, nothing else
  lines = proc.stdout.splitlines()
  assert 'configs/text.py:longformer,small' in lines[0]
  for field in (
    "task = 'text'",
    'max_length = 512',  # the small preset's
    'model.num_layers = 2',
    "model.attention.name = 'longformer'",
    'model.attention.window = (8, 16)',  # the override, a tuple
    "data.val = 'heldout'",  # a field of the task file only
  ):
    assert field in lines, field
  # Each field under its comment: base.py's and the task file's.
  above = {
    'model.num_layers = 2': 'Transformer blocks.',
    'learning_rate = 0.001': 'Peak learning rate.',
    "data.val = 'heldout'": "Validation split: 'heldout' (the last 10%",
  }
  for field, comment in above.items():
    i = lines.index(field)
    while lines[i - 1].startswith('# '):
      i -= 1
    assert lines[i].startswith(f'# {comment}'), field
  # A shared comment once, above its group (Adam's three constants).
  i = lines.index('adam_b1 = 0.9')
  assert lines[i - 1] == '# Adam moments and epsilon.'
  assert lines[i + 1] == 'adam_b2 = 0.98'
  # Every field of the config is there.
  from configs import text  # pylint: disable=g-import-not-at-top

  flat = json.loads(text.get_config('longformer,small').to_json())

  def keys(d, prefix=''):
    for k, v in d.items():
      if isinstance(v, dict):
        yield from keys(v, f'{prefix}{k}.')
      else:
        yield f'{prefix}{k}'

  printed = {ln.split(' = ')[0] for ln in lines if ' = ' in ln}
  assert set(keys(flat)) <= printed


def test_help_says_where_fields_are_documented(tmp_path):
  proc = train_py('--helpfull', cwd=tmp_path)
  assert proc.returncode in (0, 1), proc.stderr  # absl's help exits with 1
  text = ' '.join(proc.stdout.split())
  start = text.index('--config: ')
  config_help = text[start : text.index('(default', start)]
  assert 'configs/base.py' in config_help
  assert 'configs/<task>.py' in config_help
  assert '--print_config' in config_help
  assert '--[no]print_config' in text


def test_comments_are_read_from_the_source():
  found = comments.field_comments(os.path.join(ROOT, 'configs', 'mqar.py'))
  # An alias (m = c.model, d = c.data) and a comment at the end of a line.
  assert found['model.pooling'].startswith('no CLS token')
  assert found['data.test_splits'].startswith('Extra test splits')
  # base.py's comment where the task file has none of its own.
  assert found['batch_size'].startswith('Global batch size')
  # A comment shared by the assignments below it, not one at a line's end.
  assert found['adam_eps'] == 'Adam moments and epsilon.'
  assert 'data.seq_len' not in found
  # Path-X's data fields are documented in pathfinder.py, which it imports.
  pathx = comments.field_comments(os.path.join(ROOT, 'configs', 'pathx.py'))
  assert pathx['data.resolution'].startswith('Image side in pixels')


# ------------------------------------------------------------ list options
def test_a_comma_list_is_a_tuple_of_ints():
  config = cli.config_from_argv(
    smoke_argv(f'{WINDOW}=8,16', '--config.model.num_layers=2')
  )
  assert config.model.attention.window == (8, 16)
  assert all(type(w) is int for w in config.model.attention.window)
  for given in ('(8, 16)', '[8,16]'):
    config = cli.config_from_argv(
      smoke_argv(f'{WINDOW}={given}', '--config.model.num_layers=2')
    )
    assert config.model.attention.window == (8, 16)
  single = cli.config_from_argv(smoke_argv(f'{WINDOW}=8'))
  assert single.model.attention.window == 8
  both = cli.config_from_argv(
    smoke_argv(
      '--config.model.attention.dilation=1,2',
      '--config.model.attention.global_positions=0,17',
    )
  )
  assert both.model.attention.dilation == (1, 2)
  assert both.model.attention.global_positions == (0, 17)
  auto = cli.config_from_argv(smoke_argv())
  assert auto.model.attention.global_positions == 'auto'  # str stays str
  with pytest.raises(UserError, match=r'window=8,x is not a valid value'):
    cli.config_from_argv(smoke_argv(f'{WINDOW}=8,x'))
  # config.json holds a list; read back, a tuple again (and a comma-list
  # string of a config saved before, too).
  saved = json.loads(config.to_json())['model']['attention']
  assert saved['window'] == [8, 16]
  assert model_configs.attention_block(saved).window == (8, 16)
  old = {**saved, 'window': '8,16'}
  assert model_configs.attention_block(old).window == (8, 16)
  # eval.py's overrides parse the same way.
  over = cli.override_config(single, [f'{WINDOW}=4,6'])
  assert over.model.attention.window == (4, 6)


def test_per_layer_windows_train_a_smoke_step():
  config = cli.config_from_argv(
    smoke_argv(f'{WINDOW}=8,16', '--config.model.num_layers=2')
  )
  model_configs.check_attention(config)
  task = tasks.get_task(config.task)
  replicated, batch_sharding = runtime.make_mesh()
  graphdef, state = build.create_state(config, task, replicated)
  model, _ = nnx.merge(graphdef, state)
  windows = [
    core.window
    for _, core in nnx.iter_graph(model)
    if isinstance(core, LongformerAttention)
  ]
  assert windows == [8, 16]
  del model
  batch = runtime.to_device(batching.random_batch(config, task), batch_sharding)
  step = steps.make_train_step(graphdef, seed=config.seed)
  state, metrics = step(state, batch)
  assert np.isfinite(float(jax.device_get(metrics['loss'])))


def test_a_per_layer_list_of_another_length_is_one_sentence(tmp_path):
  config = cli.config_from_argv(
    smoke_argv(f'{WINDOW}=8,16,32', '--config.model.num_layers=2')
  )
  with pytest.raises(UserError) as e:
    model_configs.check_attention(config)
  text = str(e.value)
  assert text.startswith('longformer window lists 3 values, one per layer')
  assert 'the model has 2 layers' in text and 'window=8,16,' in text
  assert text.replace('e.g. ', '').count('. ') == 0 and text.endswith('.')
  # Building the model says the same (benchmark.py builds without train.py).
  from models.classifier import build_model  # pylint: disable=g-import-not-at-top

  with pytest.raises(UserError, match='lists 3 values'):
    build_model(config, tasks.get_task('listops'))
  # train.py: `error:` and exit status 2, before the workdir exists.
  workdir = tmp_path / 'run'
  proc = train_py(
    f'--config={ROOT}/configs/listops.py:longformer,smoke',
    f'--workdir={workdir}',
    f'{WINDOW}=8,16,32',
    '--config.model.num_layers=2',
    cwd=tmp_path,
  )
  assert proc.returncode == 2, proc.stderr
  errors = [ln for ln in proc.stderr.splitlines() if ln.startswith('error:')]
  assert errors == [f'error: {text}']
  assert not workdir.exists()
