"""The studies in experiments/: their sweep files plan through the sweep
command line (`python -m lra.sweep --sweep FILE.py:FN --dry_run`: nothing
trains), the rules of --sweep (lra/sweep/spec.py), and the MQAR report's
README command on the archive committed beside it."""

import functools
import importlib.util
import inspect
import os
import re
import subprocess
import sys

import pytest

from experiments.locality import locality
from lra.errors import UserError
from lra.sweep import grid as sweep_grid
from lra.sweep import main as sweep
from lra.sweep import plan as sweep_plan
from lra.sweep import spec as sweep_spec

# run_config: ml_collections loads a config file by importlib's load_module.
pytestmark = pytest.mark.filterwarnings(
  'ignore:the load_module:DeprecationWarning'
)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SWEEP_FILES = (
  'experiments/mqar/sweeps.py',
  'experiments/locality/sweeps.py',
  'experiments/mamba_recall/sweeps.py',
)


@functools.cache
def catalogue():
  return sweep.catalogue()


def functions(path):
  """The public functions a sweep file defines (each one sweep)."""
  spec = importlib.util.spec_from_file_location(
    '_sweeps', os.path.join(ROOT, path)
  )
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return [
    name
    for name, value in vars(module).items()
    if inspect.isfunction(value)
    and not name.startswith('_')
    and value.__module__ == '_sweeps'
  ]


def planned(ref, out='o', **flags):
  """[(part out, runs)] of `--sweep ref` with these flags, as the command
  line plans them."""
  flags = {
    'tasks': None,
    'models': None,
    'preset': None,
    'grid': (),
    'overrides': [],
    **flags,
  }
  parts = sweep_spec.load(os.path.join(ROOT, ref))
  result = []
  for part in parts:
    merged = sweep_spec.merge(part, out=out, where=ref, **flags)
    runs = sweep_plan.plan(
      merged.tasks,
      merged.models,
      merged.preset,
      merged.out,
      merged.overrides,
      catalogue=catalogue(),
      grid=merged.grid,
    )
    result.append((merged.out, runs))
  return result


def run_cli(*args):
  return subprocess.run(
    [sys.executable, '-m', 'lra.sweep', *args],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=300,
  )


@pytest.mark.parametrize('path', SWEEP_FILES)
def test_every_sweep_of_a_study_plans_runs_train_py_accepts(path):
  """Each function of each study's sweep file gives runs whose configs
  train.py parses, options each model's core takes, grids included."""
  names = functions(path)
  assert names, path
  for name in names:
    parts = planned(f'{path}:{name}')
    assert parts and all(runs for _, runs in parts), name
    for _, runs in parts:
      sweep.check_grid(runs)
      first = {}
      for run in runs:
        first.setdefault((run.model, run.grid[:-1]), run)
      for run in first.values():
        config, problem = sweep_plan.run_config(run)
        assert problem is None, (name, run.name, problem)
        assert sweep.attention_problem(config) is None, (name, run.name)


@pytest.mark.parametrize(
  'ref, counts',
  [
    ('experiments/mqar/sweeps.py:width_grid', (288, 288)),
    ('experiments/locality/sweeps.py:mqar', (6, 1)),
    ('experiments/mamba_recall/sweeps.py:plateau', (1, 1, 1, 2)),
  ],
)
def test_a_study_sweep_through_the_command_line_dry_run(ref, counts, tmp_path):
  out = str(tmp_path / 'runs')
  result = run_cli('--sweep', ref, '--out', out, '--dry_run', '--noprobe')
  assert result.returncode == 0, result.stderr
  planned_counts = re.findall(r'^(\d+) runs? planned', result.stdout, re.M)
  assert tuple(int(c) for c in planned_counts) == counts
  assert 'would fail' not in result.stdout
  assert not os.path.exists(out)  # a dry run writes nothing
  if len(counts) > 1:
    assert f'Sweep 1 of {len(counts)}: {out}' in result.stdout


def test_width_grid_plans_the_commands_the_flags_gave():
  """The file replaces the README's shell command run for run: the same
  train.py commands, in the same workdirs (so earlier runs are skipped)."""
  (out64, runs64), (out128, runs128) = planned(
    'experiments/mqar/sweeps.py:width_grid', out='runs/mqar'
  )
  assert (out64, out128) == ('runs/mqar/64x8', 'runs/mqar/128x16')
  models = (
    'transformer,based,gla,deltanet,linear_transformer,local,performer,'
    'reformer,bigbird,s4d,retnet,s5,h3,hyena,mamba2,mamba'
  )
  grid = sweep_grid.parse(
    [
      'model.emb_dim=128,64,32',
      'learning_rate=1e-4,3.2e-4,1e-3,3.2e-3,1e-2,3.2e-2',
    ]
  )
  flags_128 = [
    '--config.data.seq_len=128',
    '--config.data.num_kv_pairs=16',
    '--config.data.test_splits=128:8',
  ]
  by_flags = sweep_plan.plan(
    'mqar',
    models,
    'small',
    'runs/mqar/128x16',
    flags_128,
    catalogue=catalogue(),
    grid=grid,
  )
  assert [r.command() for r in runs128] == [r.command() for r in by_flags]
  assert runs64[0].command() == (
    'python train.py --config configs/mqar.py:transformer,small --workdir '
    'runs/mqar/64x8/mqar/transformer-small/model.emb_dim=128,'
    'learning_rate=1e-4 --config.data.test_splits=64:4,64:16 '
    '--config.model.emb_dim=128 --config.learning_rate=1e-4'
  )


@pytest.mark.parametrize(
  'task, blocks, overrides',
  [
    ('mqar', [2, 4, 8, 16, 32, 64], ()),
    (
      'listops',
      [2, 4, 8, 16, 32, 64, 128, 201],
      ('--config.num_train_steps=300', '--config.eval_every_steps=100'),
    ),
  ],
)
def test_locality_sweeps_plan_the_probes_runs(task, blocks, overrides):
  """experiments/locality/sweeps.py plans what the probe's own command
  plans for the README's blocks and overrides, so its --plot_only reads
  them."""
  parts = planned(f'experiments/locality/sweeps.py:{task}', out='o')
  from_file = [r.command() for _, runs in parts for r in runs]
  probe = locality.probe_runs(
    task, 'small', 'o', overrides, blocks, catalogue=catalogue()
  )
  assert from_file == [r.command() for r in probe]


def test_flags_beside_a_sweep_file_replace_or_extend_it():
  part = {
    'tasks': ['mqar'],
    'models': 'transformer,mamba',
    'preset': 'small',
    'grid': {'learning_rate': ['1e-3', '1e-2'], 'seed': [0, 1]},
    'config': {'model.emb_dim': 64, 'data.num_kv_pairs': 4, 'x.flag': True},
    'out': 'sub',
  }
  merge = functools.partial(
    sweep_spec.merge, out='runs', where='f.py:fn', tasks=None, preset=None
  )
  # Nothing beside it: the file's settings, values as train.py spells them.
  plain = merge(part, models=None, grid=(), overrides=[])
  assert plain == sweep_spec.Part(
    tasks='mqar',
    models='transformer,mamba',
    preset='small',
    grid=(('learning_rate', ('1e-3', '1e-2')), ('seed', ('0', '1'))),
    overrides=(
      '--config.model.emb_dim=64',
      '--config.data.num_kv_pairs=4',
      '--config.x.flag=true',
    ),
    out=os.path.join('runs', 'sub'),
  )
  # --models replaces; --grid replaces the file's axis of that key and adds
  # a new one; a --config key the file grids ends that axis; a --grid key
  # the file sets drops the file's override; --config adds or replaces.
  both = merge(
    part,
    models='mamba',
    grid=(('learning_rate', ('3e-3',)), ('model.emb_dim', ('32', '128'))),
    overrides=['--config.seed=5', '--config.data.num_kv_pairs=8'],
  )
  assert both.models == 'mamba'
  assert both.grid == (
    ('learning_rate', ('3e-3',)),
    ('model.emb_dim', ('32', '128')),
  )
  assert both.overrides == (
    '--config.x.flag=true',
    '--config.seed=5',
    '--config.data.num_kv_pairs=8',
  )
  # A file may spell a key as the command line does (config.seed).
  spelt = merge(
    {'tasks': 'mqar', 'models': 'mamba', 'config': {'config.seed': 3}},
    models=None,
    grid=(('seed', ('0', '1')),),
    overrides=[],
  )
  assert spelt.overrides == () and spelt.grid == (('seed', ('0', '1')),)
  # A part without tasks and no --tasks: one sentence.
  with pytest.raises(UserError, match='gives no tasks; add tasks to it or'):
    merge({'models': 'mamba'}, models=None, grid=(), overrides=[])


BAD_FILE = """
import nonexistent_module_xyz
"""
SWEEPS = """
def ok():
  return {'tasks': 'mqar', 'models': 'transformer', 'preset': 'smoke'}
def number():
  return 3
def numbers():
  return [ok(), 3]
def typo():
  return {'task': 'mqar'}
def grid_list():
  return dict(ok(), grid=['learning_rate=1e-3'])
def comma():
  return dict(ok(), grid={'data.test_splits': ['64:4,64:8']})
def outside():
  return dict(ok(), out='../elsewhere')
def raises():
  raise ValueError('no such setting')
"""


@pytest.mark.parametrize(
  'ref, message',
  [
    ('missing.py:ok', 'missing.py is not a Python file'),
    ('sweeps.py', 'is not FILE.py:FN; write e.g. --sweep'),
    ('bad.py:ok', 'failed to load (ModuleNotFoundError'),
    ('sweeps.py:nope', "has no function 'nope'; it has: comma, grid_list"),
    ('sweeps.py:number', 'returned int; return a dict of tasks, models'),
    ('sweeps.py:numbers', 'part 2 is a int; each part is a dict'),
    ('sweeps.py:typo', "unknown key 'task'; valid: tasks, models"),
    ('sweeps.py:grid_list', 'grid must be a dict of config key -> values'),
    ('sweeps.py:comma', 'needs one or more values without commas'),
    ('sweeps.py:outside', 'must be a folder below --out'),
    ('sweeps.py:raises', 'raised ValueError: no such setting'),
  ],
)
def test_a_bad_sweep_file_is_one_sentence(ref, message, tmp_path):
  (tmp_path / 'bad.py').write_text(BAD_FILE)
  (tmp_path / 'sweeps.py').write_text(SWEEPS)
  with pytest.raises(UserError, match=re.escape(message)) as e:
    sweep_spec.load(str(tmp_path / ref))
  assert '\n' not in str(e.value)


def test_a_bad_sweep_file_exits_2_with_one_error_line(tmp_path):
  (tmp_path / 'sweeps.py').write_text(SWEEPS)
  result = run_cli(
    '--sweep', str(tmp_path / 'sweeps.py:typo'), '--out', str(tmp_path / 'o')
  )
  assert result.returncode == 2
  assert result.stderr.startswith('error: --sweep: ')
  assert "unknown key 'task'" in result.stderr
  assert len(result.stderr.strip().splitlines()) == 1
  # A working file, a flag beside it: the command line's preset wins.
  result = run_cli(
    '--sweep',
    str(tmp_path / 'sweeps.py:ok'),
    '--out',
    str(tmp_path / 'o'),
    '--preset',
    'small',
    '--dry_run',
    '--noprobe',
  )
  assert result.returncode == 0, result.stderr
  assert 'configs/mqar.py:transformer,small --workdir' in result.stdout


def test_each_readme_sweep_names_a_function_of_its_file():
  """Every `--sweep FILE.py:FN` in a study's README names a function FILE
  defines, and every function of a sweep file is run by its README."""
  pattern = re.compile(r'--sweep\s+(experiments/[\w/]+\.py):(\w+)')
  for path in SWEEP_FILES:
    readme = os.path.join(ROOT, os.path.dirname(path), 'README.md')
    with open(readme) as f:
      named = {fn for file, fn in pattern.findall(f.read()) if file == path}
    assert named == set(functions(path)), path


def test_the_mqar_readme_report_command_on_the_committed_archive(tmp_path):
  """The README's report command on experiments/mqar/runs/128x16_c writes
  the committed table and its curves (tests/test_sweep_archive.py checks
  the table's rows in-process; this runs the command as the README
  gives it)."""
  out = tmp_path / 'report'
  result = subprocess.run(
    [
      sys.executable,
      '-m',
      'experiments.mqar.report',
      '--sweeps',
      'experiments/mqar/runs/128x16_c',
      '--out',
      str(out),
    ],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert result.returncode == 0, result.stderr
  assert (out / 'mqar_curves.png').stat().st_size > 10_000
  made = (out / 'mqar.md').read_text()
  committed = open(
    os.path.join(ROOT, 'experiments/mqar/128x16_c/mqar.md')
  ).read()

  # The whole file but the grid-edge line (the archive holds only the
  # completed points: 2 rates each, so every one "chose the highest").
  def kept(text):
    return [ln for ln in text.splitlines() if 'highest rate' not in ln]

  assert kept(made) == kept(committed)
  assert sum(ln.startswith('| `') for ln in kept(made)) == 36
