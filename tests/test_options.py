"""Every attention option from the command line (lra/train/options.py, the
registry's options_of, lra/train/cli.py), and evaluation with other options
(eval.py --config.model.attention.<option>=<value>).

The cores are enumerated from the registry, so a new core or mixer, or a new
option of one, is covered without editing this file: all of a core's options
are given on the command line at once (the real absl + config_flags parser,
in-process), the config must hold them with their types, and the model it
builds takes one training step.
"""

import json
import os
import shutil

import jax
import ml_collections
import numpy as np
import pytest

from lra import data as tasks
from lra.errors import UserError
from lra.report import eval_main as lra_eval
from lra.train import build, cli, steps
from lra.train import config as config_loader
from lra.train import options as model_configs
from models.attention import registry

SMOKE = 'configs/listops.py:{},smoke'
# Smaller than smoke: 33 tokens with the CLS, two segments for the recurrent
# cores (one compile per core is this file's cost).
TINY = (
  '--config.batch_size=4',
  '--config.max_length=32',
  '--config.model.segment_length=32',
)
# XLA's quick compile (the step runs once): 2-3x less compile time.
QUICK = {
  'xla_backend_optimization_level': 0,
  'xla_llvm_disable_expensive_passes': True,
}


def argv_for(model, *flags):
  return ['train.py', f'--config={SMOKE.format(model)}', *flags]


def command_line(value):
  """A value as a user types it after `--config.model.attention.<k>=`."""
  if isinstance(value, str):
    return value
  if isinstance(value, tuple):
    return repr(value)
  return str(value)


def model_of(core):
  """The model name whose core is `core`, or None (NOT_MODELS)."""
  names = model_configs.known_models()
  if core in names:
    return core
  return next((m for m in names if model_configs.core_of(m) == core), None)


@pytest.mark.parametrize('core', registry.known_cores())
def test_every_option_from_the_command_line_then_one_step(core):
  model = model_of(core)
  options = registry.options_of(core)
  if model is None:
    # Not a model (lra/train/options.py NOT_MODELS): it must have nothing to
    # set, or its options would be unreachable.
    assert core in model_configs.NOT_MODELS and not options, core
    return
  flags = [
    f'--config.model.attention.{k}={command_line(v)}'
    for k, v in options.items()
  ]
  config = cli.config_from_argv(argv_for(model, *TINY, *flags))
  block = config.model.attention.to_dict()
  default = model_configs.attention_defaults(model)
  # Every option is in the config, with the value (and type) given.
  assert set(block) == {'name', *options}
  for key, value in options.items():
    assert block[key] == value and type(block[key]) is type(value), key
  # The model's own entries (MODELS) were overridden by the flags.
  assert model_configs.changed_options(config) == {
    k: v for k, v in options.items() if default[k] != v
  }
  model_configs.check_attention(config)
  task = tasks.get_task('listops')
  graphdef, state = build.create_state(config, task, None)
  rng = np.random.default_rng(0)
  batch = {
    'inputs': rng.integers(1, task.vocab_size, (4, config.max_length)),
    'labels': rng.integers(0, task.num_classes, (4,)),
    'weights': np.ones((4,), np.float32),
  }
  batch['inputs'][:, -5:] = task.pad_id  # some padding
  key = jax.random.key(1)
  step = steps.make_train_step(graphdef).lower(state, batch, key)
  _, metrics = step.compile(compiler_options=QUICK)(state, batch, key)
  assert np.isfinite(float(metrics['loss'])), core


def test_a_core_is_found_by_its_module_name():
  # Known without a list: each module of models/attention and models/mixers
  # that registers a core, under its own name.
  names = registry.known_cores()
  assert {'softmax', 'longformer', 'reformer', 'none'} <= set(names)
  assert not {'base', 'registry', 'relative', 'memory'} & set(names)
  assert registry.get_core_class('longformer').registry_name == 'longformer'
  with pytest.raises(UserError, match='known cores: .*longformer'):
    registry.get_core_class('longformr')
  # Model names: the exceptions, then every core but NOT_MODELS.
  known = model_configs.known_models()
  assert known[:2] == ('transformer', 'transformer_fused')
  assert set(known) == (set(names) - set(model_configs.NOT_MODELS)) | {
    'transformer',
    'transformer_fused',
  }
  with pytest.raises(ValueError, match="'none' is benchmark.py's --ceiling"):
    model_configs.model_entry('none')


def test_options_come_from_the_signature():
  assert registry.options_of('sinkhorn') == {
    'block_size': 50,
    'sinkhorn_iters': 10,
    'temperature': 0.75,
  }
  assert registry.options_of('linear_transformer') == {}
  # Common arguments (and self) are never options.
  for core in registry.known_cores():
    common = registry.common_args(registry.get_core_class(core))
    assert not set(registry.options_of(core)) & {*common, 'self'}, core


def test_a_string_or_int_option_takes_both_from_the_command_line():
  # Any option annotated `int | str` that takes no sequence (e.g.
  # longformer's global_tokens: a comma list stays the string; an option
  # that takes a tuple reads it as one, test_configs_cli.py).
  both = [
    (core, k)
    for core in registry.known_cores()
    for k, p in registry.option_parameters(core).items()
    if {int, str} == set(model_configs._annotation_types(p.annotation) or ())
  ]
  if not both:
    pytest.skip('no core has an int | str option')
  core, key = both[0]
  flag = f'--config.model.attention.{key}'
  as_list = cli.config_from_argv(argv_for(model_of(core), f'{flag}=8,16,32'))
  assert as_list.model.attention[key] == '8,16,32'
  as_int = cli.config_from_argv(argv_for(model_of(core), f'{flag}=8'))
  assert as_int.model.attention[key] == 8
  # Saved and read back (config.json), the value keeps its type.
  saved = json.loads(as_list.to_json())['model']['attention']
  assert model_configs.attention_block(saved)[key] == '8,16,32'


def test_a_none_default_and_booleans_are_settable():
  # A None default with no annotation takes any literal (object), with
  # `int | None` the two; booleans take True / False.
  p = registry.option_parameters('linformer')['share_kv']
  assert model_configs.field_type(p) is bool
  config = cli.config_from_argv(
    argv_for('linformer', '--config.model.attention.share_kv=True')
  )
  assert config.model.attention.share_kv is True
  import inspect  # pylint: disable=g-import-not-at-top

  free = inspect.Parameter('x', inspect.Parameter.KEYWORD_ONLY, default=None)
  assert model_configs.field_type(free) is object
  optional = free.replace(annotation=int | None)
  union = model_configs.field_type(optional)
  assert isinstance(None, union) and isinstance(3, union)
  assert not isinstance('3', union) and not isinstance(True, union)


def test_unknown_option_is_one_sentence_naming_the_options():
  with pytest.raises(UserError) as e:
    cli.config_from_argv(
      argv_for('longformer', '--config.model.attention.windw=8')
    )
  text = str(e.value)
  assert text.startswith("longformer has no option 'windw'")
  assert "did you mean 'window'" in text and 'window=512' in text
  assert text.count('. ') == 0 and text.endswith('.')
  with pytest.raises(UserError, match="softmax has no option 'window'"):
    cli.config_from_argv(
      argv_for('transformer', '--config.model.attention.window=8')
    )
  with pytest.raises(
    UserError, match='linear_transformer has no option .* no options'
  ):
    cli.config_from_argv(
      argv_for('linear_transformer', '--config.model.attention.window=8')
    )
  # Another core's name keeps the model's options: choose the model.
  with pytest.raises(UserError, match='configs/<task>.py:performer'):
    cli.config_from_argv(
      argv_for(
        'transformer',
        '--config.model.attention.name=performer',
        '--config.model.attention.kernel=relu',
      )
    )
  # The same sentence from the registry's builder.
  with pytest.raises(
    UserError, match="reformer has no option 'hashes'.*num_hashes="
  ):
    registry.build(
      {'name': 'reformer', 'hashes': 2},
      num_heads=1,
      head_dim=4,
      max_length=8,
      dropout_rate=0.0,
      dtype=np.float32,
      rngs=None,
    )


def test_name_flag_with_foreign_options_is_refused_before_training():
  config = cli.config_from_argv(
    argv_for('transformer', '--config.model.attention.name=performer')
  )
  with pytest.raises(UserError, match='configs/listops.py:performer'):
    model_configs.check_attention(config)
  # A core that is no model name is not offered as one.
  config = cli.config_from_argv(
    argv_for('transformer', '--config.model.attention.name=none')
  )
  with pytest.raises(UserError, match="none is benchmark.py's --ceiling"):
    model_configs.check_attention(config)
  # A core without options may be swapped in by name.
  fine = cli.config_from_argv(
    argv_for('linear_transformer', '--config.model.attention.name=none')
  )
  model_configs.check_attention(fine)


def test_task_overrides_keep_their_values():
  def get(task, model, preset=''):
    module = __import__(f'configs.{task}', fromlist=['get_config'])
    arg = model + (f',{preset}' if preset else '')
    return module.get_config(arg)

  image_bigbird = get('image', 'bigbird')
  assert image_bigbird.model.num_heads == 4
  assert image_bigbird.model.attention.block_size == 64
  assert image_bigbird.model.attention.num_random_blocks == 3
  image_sinkhorn = get('image', 'sinkhorn')
  assert image_sinkhorn.weight_decay == 0.7
  assert image_sinkhorn.model.num_layers == 1
  assert image_sinkhorn.model.emb_dim == 32  # the base architecture
  assert get('image', 'reformer').model.emb_dim == 64
  pf_performer = get('pathfinder', 'performer')
  assert (pf_performer.model.num_layers, pf_performer.model.emb_dim) == (1, 128)
  assert get('pathfinder', 'sinkhorn').model.attention.block_size == 64
  assert get('pathfinder', 'local').model.dropout_rate == 0.1
  # Path-X shares Pathfinder's code, not its tuned overrides.
  assert get('pathx', 'performer').model.emb_dim == 32
  # Models: transformer_fused drops attention dropout; local's block is 50
  # (its core's default); the recurrent ones use relative positions.
  fused = get('listops', 'transformer_fused')
  assert fused.model.attention_dropout_rate == 0.0
  assert fused.model.attention.implementation == 'fused'
  assert get('listops', 'local').model.attention.block_size == 50
  assert get('text', 'transformer_xl').model.positions == 'relative'
  assert get('listops', 'transformer').model.attention.to_dict() == {
    'name': 'softmax',
    'implementation': 'einsum',
    'relative': False,
    'fused_kernel': 'auto',
  }
  # Presets still come after the overrides.
  assert get('image', 'bigbird', 'smoke').model.emb_dim == 16
  # A task's tuned value differs from the model's default (local: 50).
  image_local = get('image', 'local')
  assert image_local.model.pooling == 'mean'
  assert model_configs.changed_options(image_local) == {'block_size': 64}
  assert model_configs.changed_options(image_local, image_local) == {}


def test_eval_options_keep_or_refuse_the_trained_shapes():
  task = tasks.get_task('listops')

  def saved(model):
    config = cli.config_from_argv(argv_for(model))
    return ml_collections.ConfigDict(json.loads(config.to_json()))

  hashes = registry.options_of('reformer')['num_hashes']
  config, changed = lra_eval.with_eval_options(
    saved('reformer'),
    task,
    [f'--config.model.attention.num_hashes={hashes + 1}'],
  )
  assert changed == {'num_hashes': (hashes, hashes + 1)}
  assert config.model.attention.num_hashes == hashes + 1
  with pytest.raises(UserError) as e:
    lra_eval.with_eval_options(
      saved('linformer'),
      task,
      [
        '--config.model.attention.share_heads=True',
        '--config.model.attention.proj_length=16',
      ],
    )
  text = str(e.value)
  assert text.startswith('--config.model.attention.proj_length=16 changes')
  assert '(65, 256) -> (65, 16)' in text
  with pytest.raises(UserError, match='only --config.model.attention'):
    lra_eval.with_eval_options(
      saved('reformer'), task, ['--config.model.num_layers=2']
    )


def test_eval_with_another_option_on_a_trained_run(smoke_run, tmp_path):
  workdir = str(tmp_path / 'run')
  shutil.copytree(smoke_run, workdir)
  plain = lra_eval.evaluate_checkpoint(workdir, 'val')
  other = lra_eval.evaluate_checkpoint(
    workdir, 'val', overrides=['--config.model.attention.fused_kernel=xla']
  )
  # fused_kernel only matters for the fused implementation: same numbers.
  assert other['accuracy'] == plain['accuracy']
  assert other['file'] == 'eval_val_best_fused_kernelxla.json'
  with open(os.path.join(workdir, other['file'])) as f:
    written = json.load(f)
  assert written['eval_options'] == {'fused_kernel': 'xla'}
  assert written['trained_options'] == {'fused_kernel': 'auto'}
  with pytest.raises(UserError, match='relative=True changes the shapes'):
    lra_eval.evaluate_checkpoint(
      workdir, 'val', overrides=['--config.model.attention.relative=True']
    )


def test_a_run_saved_before_an_option_existed_reads_its_default():
  # config.json of an older run lacks the option: it ran with the default.
  old = {'name': 'sinkhorn', 'block_size': 64}
  assert model_configs.attention_block(old).to_dict() == {
    'name': 'sinkhorn',
    'block_size': 64,
    'sinkhorn_iters': 10,
    'temperature': 0.75,
  }
  saved = {'model_name': 'sinkhorn', 'model': {'attention': old}}
  assert model_configs.changed_options(saved) == {'block_size': 64}
  config = cli.config_from_argv(argv_for('sinkhorn'))
  defaults = config_loader.predated_defaults(config)
  assert defaults.model.attention.sinkhorn_iters == 10
  # eval.py keeps --config.* flags apart from its own.
  rest, overrides = cli.split_overrides(
    [
      'eval.py',
      '--workdir=w',
      '--config.model.attention.rank',
      '4',
      '-split=val',
    ]
  )
  assert rest == ['eval.py', '--workdir=w', '-split=val']
  assert overrides == ['--config.model.attention.rank=4']
