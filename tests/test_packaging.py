"""One namespace: what `pip install .` puts into site-packages (lra, models,
configs and nothing else), the console scripts pointing into lra/, the
shims at most 30 lines, child processes started as `python -m lra...`, and
`--config configs/<task>.py` read from the configs package when the
working directory has no such file.

The wheel itself is built by the slow test (pip fetches setuptools for its
isolated build); the rest reads pyproject.toml and the sources.
"""

import ast
import glob
import os
import pathlib
import shutil
import subprocess
import sys
import tomllib
import zipfile

import pytest
import setuptools

from lra.sweep import runner as sweep_runner
from lra.sweep.plan import TRAIN_MODULE, Run
from lra.train import child, cli
from lra.train import config as config_loader

ROOT = pathlib.Path(__file__).resolve().parent.parent
SHIMS = ('train.py', 'eval.py', 'benchmark.py', 'scaling.py')
PACKAGES = {'lra', 'models', 'configs'}


def pyproject():
  return tomllib.loads((ROOT / 'pyproject.toml').read_text())


def test_pyproject_installs_the_three_packages_only():
  setup = pyproject()['tool']['setuptools']
  assert 'py-modules' not in setup
  include = setup['packages']['find']['include']
  # The function setuptools' packages.find runs, on the same patterns.
  found = setuptools.find_packages(str(ROOT), include=include)
  assert {p.split('.')[0] for p in found} == PACKAGES
  assert {'lra.train', 'lra.report', 'lra.bench', 'lra.sweep'} <= set(found)


def module_file(module):
  return ROOT / (module.replace('.', '/') + '.py')


def defines(path, name):
  tree = ast.parse(path.read_text())
  return any(
    isinstance(n, ast.FunctionDef) and n.name == name for n in tree.body
  )


def test_console_scripts_point_into_lra():
  scripts = pyproject()['project']['scripts']
  assert {'lra-train', 'lra-eval', 'lra-benchmark', 'lra-sweep'} <= set(scripts)
  for name, target in scripts.items():
    module, func = target.split(':')
    assert module.startswith('lra.'), (name, target)
    assert defines(module_file(module), func), (name, target)
  assert scripts['lra-train'] == 'lra.train.main:run'
  assert scripts['lra-eval'] == 'lra.report.eval_main:run'


@pytest.mark.parametrize('shim', SHIMS)
def test_shims_are_short_and_run_a_module_of_lra(shim):
  source = (ROOT / shim).read_text()
  assert len(source.splitlines()) <= 30
  imported = [
    n.module
    for n in ast.walk(ast.parse(source))
    if isinstance(n, ast.ImportFrom)
  ]
  scripts = set(pyproject()['project']['scripts'].values())
  assert any(f'{m}:run' in scripts for m in imported), imported
  # The early Ctrl-C handler (one line, exit 130), set before the import.
  assert source.index('on_ctrl_c_exit()') < source.index('import run')


def library_files():
  for package in ('lra', 'models'):
    yield from sorted((ROOT / package).rglob('*.py'))


SUBPROCESS_CALLS = ('Popen', 'run', 'call', 'check_call', 'check_output')


def shim_paths_started(source):
  """The constant strings naming a shim (train.py, ...) inside subprocess
  calls of `source`."""
  found = []
  for node in ast.walk(ast.parse(source)):
    if not isinstance(node, ast.Call):
      continue
    name = getattr(node.func, 'attr', getattr(node.func, 'id', None))
    if name not in SUBPROCESS_CALLS:
      continue
    for inner in ast.walk(node):
      if isinstance(inner, ast.Constant) and isinstance(inner.value, str):
        if inner.value.endswith(SHIMS):
          found.append(inner.value)
  return found


def walks_out_of_its_package(path, root=ROOT):
  """Whether `path` (a module of lra/ or models/ below `root`) builds a path
  from its own __file__ with more os.path.dirname calls than lead back to
  its top package: a path to the repository around it."""
  depth = len(path.relative_to(root).parts) - 1  # dirname calls to lra/
  for node in ast.walk(ast.parse(path.read_text())):
    count, inner = 0, node
    while (
      isinstance(inner, ast.Call)
      and getattr(inner.func, 'attr', None) == 'dirname'
      and inner.args
    ):
      count += 1
      inner = inner.args[0]
      if isinstance(inner, ast.Call) and getattr(inner.func, 'attr', '') in (
        'abspath',
        'realpath',
      ):
        inner = inner.args[0]
    if count > depth and isinstance(inner, ast.Name) and inner.id == '__file__':
      return True
  return False


def test_the_checks_see_what_they_look_for(tmp_path):
  assert shim_paths_started(
    "subprocess.Popen([sys.executable, 'train.py', '--config=x'])"
  ) == ['train.py']
  assert shim_paths_started("subprocess.run(['python', '-m', 'lra.x'])") == []
  fake = tmp_path / 'lra' / 'report' / 'fake.py'
  fake.parent.mkdir(parents=True)
  up = 'os.path.dirname(os.path.dirname(os.path.abspath(__file__)))'
  fake.write_text(f'ROOT = os.path.dirname({up})\n')
  assert walks_out_of_its_package(fake, tmp_path)
  fake.write_text(f'PACKAGE = {up}\n')  # lra/: inside the package
  assert not walks_out_of_its_package(fake, tmp_path)


def test_the_library_never_needs_the_checkout():
  for path in library_files():
    source = path.read_text()
    assert shim_paths_started(source) == [], path
    assert not walks_out_of_its_package(path), path


def test_a_sweep_starts_its_runs_as_python_m(tmp_path, monkeypatch):
  started = []

  class Child:
    pid = 0

    def __init__(self, argv, **kwargs):
      started.append((argv, kwargs))

  monkeypatch.setattr(sweep_runner.subprocess, 'Popen', Child)
  run = Run('listops', 'transformer', 'smoke', str(tmp_path))
  sweep = sweep_runner.Sweep([run], str(tmp_path))
  sweep._start(run)  # pylint: disable=protected-access
  ((argv, kwargs),) = started
  assert argv[:3] == [sys.executable, '-m', TRAIN_MODULE]
  assert argv[3:5] == ['--config', 'configs/listops.py:transformer,smoke']
  root = kwargs['env']['PYTHONPATH'].split(os.pathsep)[0]
  assert os.path.isfile(os.path.join(root, 'lra', '__init__.py'))


def test_child_import_root_holds_this_lra():
  import lra  # pylint: disable=g-import-not-at-top

  root = child.import_root()
  assert os.path.samefile(
    os.path.join(root, 'lra'), os.path.dirname(lra.__file__)
  )
  assert child.command('lra.x', '--a') == [sys.executable, '-m', 'lra.x', '--a']


def test_config_path_falls_back_to_the_configs_package(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  packaged = os.path.join(config_loader.configs_dir(), 'listops.py')
  assert config_loader.resolve('configs/listops.py') == packaged
  assert config_loader.resolve('./configs/listops.py') == packaged
  # Not the package's spelling, or no such config: read as given.
  assert config_loader.resolve('other/listops.py') == 'other/listops.py'
  assert config_loader.resolve('configs/nope.py') == 'configs/nope.py'
  config = cli.config_from_argv(
    ['train.py', '--config=configs/listops.py:transformer,smoke']
  )
  assert config.task == 'listops' and config.preset == 'smoke'
  # A file of that name in the working directory is the one read.
  (tmp_path / 'configs').mkdir()
  mine = tmp_path / 'configs' / 'listops.py'
  mine.write_text(
    'from configs import listops\n\n\n'
    'def get_config(arg=None):\n'
    '  c = listops.get_config(arg)\n'
    '  c.unlock()\n'
    '  c.seed = 17\n'
    '  return c\n'
  )
  assert config_loader.resolve('configs/listops.py') == 'configs/listops.py'
  config = cli.config_from_argv(
    ['train.py', '--config=configs/listops.py:transformer,smoke']
  )
  assert config.seed == 17


@pytest.mark.slow
def test_the_wheel_holds_lra_models_configs_only(tmp_path):
  """pip wheel of a copy of the project (the checkout is left clean):
  its top-level names and console scripts."""
  src = tmp_path / 'src'
  src.mkdir()
  for name in ('pyproject.toml', 'README.md', *SHIMS):
    shutil.copy(ROOT / name, src / name)
  for package in PACKAGES:
    shutil.copytree(
      ROOT / package,
      src / package,
      ignore=shutil.ignore_patterns('__pycache__'),
    )
  subprocess.run(
    [sys.executable, '-m', 'pip', 'wheel', '--no-deps', '-q', '-w',
     str(tmp_path / 'dist'), str(src)],
    check=True, capture_output=True, timeout=600,
  )  # fmt: skip
  (wheel,) = glob.glob(str(tmp_path / 'dist' / '*.whl'))
  names = zipfile.ZipFile(wheel).namelist()
  tops = {n.split('/')[0] for n in names if not n.split('/')[0].endswith(
    '.dist-info'
  )}  # fmt: skip
  assert tops == PACKAGES
  entry = next(n for n in names if n.endswith('entry_points.txt'))
  text = zipfile.ZipFile(wheel).read(entry).decode()
  assert 'lra-train = lra.train.main:run' in text
  assert 'train:run' not in text.replace('lra.train.main:run', '')
