"""Hostile input, round three (command lines): --help of every entry point
and console script, options that do not apply to the chosen model,
non-finite option values, a config file that does not load."""

import subprocess
import sys

from conftest import ROOT, SMOKE
import pytest

# (command, flags its usage must name): the scripts of the card and the
# modules the console scripts (pyproject.toml) point to.
ENTRY_POINTS = [
  (['train.py'], ['--config', '--workdir', '--print_config']),
  (['eval.py'], ['--workdir', '--split', '--table']),
  (['benchmark.py'], ['--config', '--out']),
  (['-m', 'lra.sweep'], ['--sweep', '--out', '--dry_run']),
  (['-m', 'lra.sweep.archive'], ['--sweep', '--out']),
  (['-m', 'lra.data.prepare'], ['--data_dir', '--force']),
  (['-m', 'lra.train.main'], ['--config', '--workdir']),
]
# Console scripts as pip installs them: a wrapper that imports the
# function and calls it with sys.argv[0] the script's name.
CONSOLE = {
  'lra-train': 'train:run',
  'lra-eval': 'eval:run',
  'lra-benchmark': 'lra.bench.main:run',
  'lra-prepare': 'lra.data.prepare:run',
  'lra-sweep': 'lra.sweep.main:run',
}


def help_of(args):
  return subprocess.run(
    [sys.executable, *args], cwd=ROOT, capture_output=True, text=True,
    timeout=120,
  )  # fmt: skip


@pytest.mark.parametrize('command, names', ENTRY_POINTS)
def test_help_prints_the_usage_and_the_flags_and_exits_0(command, names):
  flag = '-h' if command == ['train.py'] else '--help'
  proc = help_of([*command, flag])
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert 'Traceback' not in proc.stderr
  for name in names:
    assert name in proc.stdout, (name, proc.stdout[-3000:])


@pytest.mark.parametrize('script', sorted(CONSOLE))
def test_console_scripts_help_names_their_flags(script):
  module, function = CONSOLE[script].split(':')
  code = (
    f'import sys; sys.argv = [{script!r}, "--help"]; '
    f'import {module} as m; sys.exit(m.{function}())'
  )
  proc = help_of(['-c', code])
  assert proc.returncode == 0, proc.stderr[-2000:]
  names = dict((c[-1], n) for c, n in ENTRY_POINTS)
  key = {
    'lra-train': 'train.py', 'lra-eval': 'eval.py',
    'lra-benchmark': 'benchmark.py', 'lra-prepare': 'lra.data.prepare',
    'lra-sweep': 'lra.sweep',
  }[script]  # fmt: skip
  for name in names[key]:
    assert name in proc.stdout, (script, name, proc.stdout[-3000:])
  assert 'Try --helpfull' not in proc.stdout + proc.stderr


def test_help_with_a_config_prints_the_usage_not_an_error():
  proc = help_of(['train.py', f'--config={SMOKE}', '--help'])
  assert proc.returncode == 0 and '--workdir' in proc.stdout


# A config file of one's own that does not load, and the line to name.
BROKEN_CONFIGS = {
  'syntax': ('from configs import listops\ndef get_config(arg:\n', 2),
  'indent': ('def get_config(arg=None):\n  if arg:\n return 1\n', 3),
  'name': ('def get_config(arg=None):\n  return listops.get_config(arg)\n', 2),
  'raises': ('import os\nraise RuntimeError("half-edited")\n', 2),
  'value': ('def get_config(arg=None):\n  return int("x1")\n', 2),
  'no_get_config': ('x = 1\n', None),
  'binary': (b'\x00\x93\xff garbage', None),  # no line: null bytes
}


@pytest.mark.parametrize('kind', sorted(BROKEN_CONFIGS))
def test_a_config_file_that_does_not_load_is_one_sentence_naming_it(
  tmp_path, kind
):
  from lra.errors import UserError  # pylint: disable=g-import-not-at-top
  from lra.train import cli  # pylint: disable=g-import-not-at-top

  text, line = BROKEN_CONFIGS[kind]
  path = tmp_path / 'mine.py'
  if isinstance(text, bytes):
    path.write_bytes(text)
  else:
    path.write_text(text)
  with pytest.raises(UserError) as e:
    cli.config_from_argv(['train.py', f'--config={path}:transformer'])
  said = str(e.value)
  assert said.startswith(f'cannot load config file {path}'), said
  if line:
    assert f'{path}, line {line}' in said, said
  assert '\n' not in said and 'Traceback' not in said


def test_a_file_without_get_config_never_runs_an_earlier_files(tmp_path):
  """config_flags loads every file as one module name; a file loaded after
  another one in the same process (the suite, a notebook, a sweep) must not
  run the earlier file's get_config (the suite once passed such a file
  with the ListOps config)."""
  from lra.errors import UserError  # pylint: disable=g-import-not-at-top
  from lra.train import cli  # pylint: disable=g-import-not-at-top

  cli.config_from_argv(['train.py', f'--config={SMOKE}'])
  path = tmp_path / 'mine.py'
  path.write_text('x = 1\n')
  with pytest.raises(UserError, match='get_config'):
    cli.config_from_argv(['train.py', f'--config={path}:transformer'])


def test_train_with_a_broken_config_file_is_one_line_and_creates_nothing(
  tmp_path,
):
  path = tmp_path / 'mine.py'
  path.write_text('from configs.listops import *\n\ndef broken(:\n')
  proc = subprocess.run(
    [sys.executable, 'train.py', f'--config={path}:transformer,smoke',
     f'--workdir={tmp_path / "run"}'],
    cwd=ROOT, capture_output=True, text=True, timeout=120,
  )  # fmt: skip
  assert proc.returncode == 2 and 'Traceback' not in proc.stderr
  (line,) = proc.stderr.strip().splitlines()
  assert (
    line.startswith('error: cannot load config file') and ', line 3' in line
  )
  assert not (tmp_path / 'run').exists()


def test_the_packages_own_config_errors_keep_their_sentences():
  from lra.errors import UserError  # pylint: disable=g-import-not-at-top
  from lra.train import cli  # pylint: disable=g-import-not-at-top

  with pytest.raises(UserError, match="^Unknown model 'nosuch'"):
    cli.config_from_argv(['train.py', '--config=configs/listops.py:nosuch'])


# ------------------------------------------ options that do not apply
def checked(model, *flags, task='listops', preset='smoke'):
  """The config train.py would run for these flags, checked as train.py
  checks it (UserError when it refuses)."""
  from lra.train import cli  # pylint: disable=g-import-not-at-top
  from lra.train import config as config_loader  # pylint: disable=g-import-not-at-top

  spec = f'configs/{task}.py:{model}' + (f',{preset}' if preset else '')
  config = cli.config_from_argv(['train.py', f'--config={spec}', *flags])
  config_loader.check(config)
  return config


@pytest.mark.parametrize(
  'model, flag',
  [
    ('transformer', '--config.ssm_learning_rate=0.01'),
    ('performer', '--config.ssm_weight_decay=0.1'),
    ('mamba', '--config.ssm_weight_decay=0.1'),  # without ssm_learning_rate
    ('transformer', '--config.model.norm=batch'),
    ('s4d', '--config.model.prenorm=False'),  # s4d here: transformer block
    ('transformer', '--config.model.segment_length=24'),
    ('longformer', '--config.model.segment_remat=True'),
    ('transformer', '--config.mask_rate=0.3'),
    ('transformer', '--config.model.tie_lm_head=False'),
    ('transformer', '--config.init_from_checkpoint=latest'),
  ],
)
def test_an_option_that_does_not_apply_is_one_sentence(model, flag):
  from lra.errors import UserError  # pylint: disable=g-import-not-at-top

  with pytest.raises(UserError) as e:
    checked(model, flag)
  said = str(e.value)
  key = flag.split('=')[0]
  assert said.startswith(f'{flag} does not apply to this run'), said
  assert key in said and 'drop the flag' in said


@pytest.mark.parametrize(
  'model, flags',
  [
    ('s4d', ['--config.ssm_learning_rate=0.001']),
    ('mamba', ['--config.ssm_learning_rate=0.001',
               '--config.ssm_weight_decay=0.0']),
    ('s5', ['--config.model.block=ssm', '--config.model.norm=batch']),
    ('transformer_xl', ['--config.model.segment_length=16']),
    ('transformer', ['--config.objective=masked_lm', '--config.mask_rate=0.3',
                     '--config.model.tie_lm_head=False']),
    ('transformer', ['--config.init_from=/somewhere',
                     '--config.init_from_checkpoint=latest']),
  ],
)  # fmt: skip
def test_the_same_options_where_they_apply_pass(model, flags):
  checked(model, *flags)


@pytest.mark.parametrize(
  'flag',
  [
    '--config.model.embed_std=nan',
    '--config.learning_rate=inf',
    '--config.weight_decay=-inf',
    '--config.model.dropout_rate=nan',
    '--config.adam_eps=nan',
    '--config.checkpoint_every_minutes=inf',
  ],
)
def test_a_non_finite_option_is_refused_before_training(flag):
  from lra.errors import UserError  # pylint: disable=g-import-not-at-top

  with pytest.raises(UserError) as e:
    checked('transformer', flag)
  assert flag.split('=')[0] in str(e.value)
  assert 'not finite' in str(e.value) or 'finite number' in str(e.value)
  assert 'diverged' not in str(e.value)


def test_non_finite_attention_options_are_refused_too():
  from lra.errors import UserError  # pylint: disable=g-import-not-at-top
  from lra.train import options  # pylint: disable=g-import-not-at-top
  from models.attention import registry  # pylint: disable=g-import-not-at-top

  for model in ('performer', 'mamba', 's4d', 'linear_transformer', 'hyena'):
    floats = [
      k for k, v in registry.options_of(options.core_of(model)).items()
      if isinstance(v, float)
    ]  # fmt: skip
    for key in floats[:2]:
      with pytest.raises(UserError, match='finite'):
        checked(model, f'--config.model.attention.{key}=nan')


def test_train_refuses_them_in_one_line_and_creates_nothing(tmp_path):
  for flag in (
    '--config.ssm_learning_rate=0.01',
    '--config.model.embed_std=nan',
  ):
    proc = subprocess.run(
      [sys.executable, 'train.py', f'--config={SMOKE}',
       f'--workdir={tmp_path / "run"}', flag],
      cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-2000:]
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(f'error: {flag}'), line
    assert not (tmp_path / 'run').exists()
