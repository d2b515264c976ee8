"""Hostile input, round three (a run's life): a workdir of someone else's
files, a full disk at the start of a run, a kernel that cannot be built,
signals at every stage of a run."""

import builtins
import errno
import json
import os
import shutil
import subprocess
import sys

from conftest import ROOT, SMOKE, tree
import pytest

from lra.errors import UserError
from lra.train import rundir


def train(workdir, data_dir, *flags, timeout=300, env=None):
  return subprocess.run(
    [sys.executable, 'train.py', f'--config={SMOKE}', f'--workdir={workdir}',
     f'--config.data_dir={data_dir}', *flags],
    cwd=ROOT, capture_output=True, text=True, timeout=timeout,
    env=None if env is None else dict(os.environ, **env),
  )  # fmt: skip


# ------------------------------------------------------- foreign folders
def make(folder, files):
  for name, text in files.items():
    path = os.path.join(folder, name)
    if name.endswith('/'):
      os.makedirs(path, exist_ok=True)
      continue
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, 'w') as f:
      f.write(text)


OURS_CONFIG = json.dumps(
  {'task': 'listops', 'model': {'num_layers': 2}, 'num_train_steps': 6,
   'learning_rate': 0.05, 'batch_size': 32}
)  # fmt: skip
ROW = json.dumps({'step': 2, 'split': 'train', 'loss': 1.0}) + '\n'


@pytest.mark.parametrize(
  'files, foreign',
  [
    ({}, False),
    ({'.lock': ''}, False),
    ({'.lock': '', 'train.log': 'x'}, False),  # a sweep's, before the run
    ({'config.json': OURS_CONFIG, 'notes.txt': 'mine'}, False),
    ({'metrics.jsonl': ROW}, False),
    ({'checkpoints/latest/': '', 'checkpoints/best/': ''}, False),
    ({'config.json': '{"lr": 1}'}, True),  # someone else's config.json
    ({'config.json': '{"lr": 1}', 'checkpoints/latest/': ''}, True),
    ({'config.json': 'not json'}, True),
    ({'notes.txt': 'mine'}, True),
    ({'checkpoints/model.pt': 'torch'}, True),  # another project's
    ({'metrics.jsonl': 'epoch,loss\n1,0.5\n'}, True),
    ({'data/': ''}, True),
  ],
)
def test_what_a_run_of_this_project_is(tmp_path, files, foreign):
  make(str(tmp_path), files)
  assert bool(rundir.foreign_files(str(tmp_path))) == foreign
  if foreign:
    with pytest.raises(UserError, match='--allow_foreign_workdir'):
      rundir.check_not_foreign(str(tmp_path))
  assert rundir.foreign_files(str(tmp_path / 'missing')) == []


def test_a_folder_of_someone_elses_files_is_refused_then_allowed(
  tmp_path, smoke_data_dir
):
  workdir = tmp_path / 'theirs'
  make(str(workdir), {'config.json': '{"their": 1}', 'notes.txt': 'keep'})
  before = tree(workdir)
  proc = train(workdir, smoke_data_dir)
  assert proc.returncode == 2, proc.stderr[-2000:]
  (line,) = proc.stderr.strip().splitlines()
  assert line.startswith('error: --workdir') and 'config.json' in line
  assert '--allow_foreign_workdir' in line
  assert tree(workdir) == before and sorted(os.listdir(workdir)) == [
    'config.json',
    'notes.txt',
  ]
  proc = train(workdir, smoke_data_dir, '--allow_foreign_workdir')
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert (workdir / 'notes.txt').read_text() == 'keep'
  assert json.loads((workdir / 'results.json').read_text())['task'] == 'listops'
  # Now a run of this project: the same command resumes without the flag.
  assert train(workdir, smoke_data_dir).returncode == 0


def test_the_flag_is_in_the_usage():
  proc = subprocess.run(
    [sys.executable, 'train.py', '--help'], cwd=ROOT, capture_output=True,
    text=True, timeout=120,
  )  # fmt: skip
  assert '--[no]allow_foreign_workdir' in proc.stdout


# ------------------------------------------ a full disk at the start
def smoke_config(data_dir):
  from lra.train import config as config_loader  # pylint: disable=g-import-not-at-top

  config = config_loader.task_config('listops', 'transformer,smoke')
  config.data_dir = data_dir
  return config


def full_disk_at(monkeypatch, suffix):
  """Writes to a path ending with `suffix` fail with ENOSPC (open for
  writing and os.open), as on a full disk."""
  real_open, real_os_open = builtins.open, os.open

  def full_open(file, mode='r', *args, **kwargs):
    if str(file).endswith(suffix) and any(c in mode for c in 'wax+'):
      raise OSError(errno.ENOSPC, 'No space left on device', str(file))
    return real_open(file, mode, *args, **kwargs)

  def full_os_open(path, flags, *args, **kwargs):
    if str(path).endswith(suffix) and flags & (os.O_WRONLY | os.O_RDWR):
      raise OSError(errno.ENOSPC, 'No space left on device', str(path))
    return real_os_open(path, flags, *args, **kwargs)

  monkeypatch.setattr(builtins, 'open', full_open)
  monkeypatch.setattr(os, 'open', full_os_open)


@pytest.mark.parametrize(
  'suffix',
  ['config.json.tmp', 'metrics.jsonl.tmp', '.lock', 'results.json.tmp'],
)
def test_a_resume_on_a_full_disk_is_one_sentence_and_loses_nothing(
  tmp_path, smoke_run, smoke_data_dir, monkeypatch, suffix
):
  from lra.train import loop  # pylint: disable=g-import-not-at-top

  workdir = str(tmp_path / 'run')
  shutil.copytree(smoke_run, workdir)
  os.remove(os.path.join(workdir, 'results.json'))
  before = tree(workdir)
  config = smoke_config(smoke_data_dir)
  full_disk_at(monkeypatch, suffix)
  with pytest.raises(UserError) as e:
    loop.train_and_evaluate(config, workdir)
  said = str(e.value)
  assert 'no space left on device' in said and 'run the same command' in said
  assert '\n' not in said
  after = tree(workdir)
  assert after['config.json'] == before['config.json']
  # Rows may be added (the test's, before results.json), none lost.
  assert after['metrics.jsonl'].startswith(before['metrics.jsonl'])
  assert {k for k in after if k.startswith('checkpoints')} == {
    k for k in before if k.startswith('checkpoints')
  }
  assert not [k for k in after if k.endswith('.tmp')]
  monkeypatch.undo()
  results = loop.train_and_evaluate(config, workdir)
  with open(os.path.join(smoke_run, 'results.json')) as f:
    assert results['test'] == json.load(f)['test']


def test_a_fresh_run_on_a_full_disk_is_one_sentence(
  tmp_path, smoke_data_dir, monkeypatch
):
  from lra.train import loop  # pylint: disable=g-import-not-at-top

  full_disk_at(monkeypatch, 'config.json.tmp')
  with pytest.raises(UserError, match='no space left on device'):
    loop.train_and_evaluate(smoke_config(smoke_data_dir), str(tmp_path / 'r'))
  assert not [p for p in tmp_path.rglob('*.tmp')]


# ------------------------------------------ a kernel that cannot be built
def test_native_kernel_without_a_compiler_is_the_error_line_only(
  tmp_path, smoke_data_dir
):
  proc = subprocess.run(
    [sys.executable, 'train.py', '--config=configs/listops.py:mamba,smoke',
     f'--workdir={tmp_path / "run"}', f'--config.data_dir={smoke_data_dir}',
     '--config.model.attention.scan_kernel=native'],
    cwd=ROOT, capture_output=True, text=True, timeout=300,
    env=dict(os.environ, CXX=str(tmp_path / 'no-compiler'),
             LRA_CACHE_DIR=str(tmp_path / 'cache')),
  )  # fmt: skip
  assert proc.returncode == 2, proc.stderr[-2000:]
  (line,) = proc.stderr.strip().splitlines()
  assert line.startswith('error: mamba scan_kernel=native cannot run')
  assert not (tmp_path / 'run').exists()


# ------------------------------------------ signals at every stage
# A driver that runs train.py's command line and sends itself `signum` as
# the chosen stage begins (deterministic: no race with a timer).
DRIVER = """
import os, signal, sys
stage, signum = sys.argv[1], int(sys.argv[2])
sys.argv = ['train.py'] + sys.argv[3:]
from lra.train.interrupt import on_ctrl_c_exit
on_ctrl_c_exit()
from lra.train import loop, results
from lra.train.checkpoints import Checkpoints
fired = []
def wrap(owner, name, when=lambda *a, **k: True):
  orig = getattr(owner, name)
  def f(*a, **k):
    if not fired and when(*a, **k):
      fired.append(1)
      os.kill(os.getpid(), signum)
    return orig(*a, **k)
  setattr(owner, name, f)
if stage == 'restore':
  wrap(loop, 'make_trainer')
elif stage == 'compile':
  wrap(loop, 'compiles_at', lambda t, step, start: step == start + 1)
elif stage == 'training':
  wrap(loop, 'compiles_at', lambda t, step, start: step == start + 3)
elif stage == 'evaluation':
  wrap(loop.Trainer, 'evaluate', lambda self, state, split: split == 'val')
elif stage == 'save':
  wrap(Checkpoints, 'save')
elif stage == 'test':
  wrap(results, 'test_best_and_last')
elif stage == 'results':
  wrap(results, 'finish')
import train
train.run()
"""
SIGNALS = {'SIGINT': (2, 130), 'SIGTERM': (15, 143), 'SIGHUP': (1, 129)}


# Each signal once in the default run (about 22 s a case); every stage with
# -m slow.
@pytest.mark.parametrize(
  'stage, name',
  [
    pytest.param('restore', 'SIGTERM', marks=pytest.mark.slow),
    pytest.param('compile', 'SIGHUP', marks=pytest.mark.slow),
    ('training', 'SIGINT'),
    pytest.param('evaluation', 'SIGTERM', marks=pytest.mark.slow),
    ('save', 'SIGHUP'),
    pytest.param('test', 'SIGINT', marks=pytest.mark.slow),
    ('test', 'SIGTERM'),
    pytest.param('test', 'SIGHUP', marks=pytest.mark.slow),
    pytest.param('results', 'SIGTERM', marks=pytest.mark.slow),
  ],
)
def test_a_signal_at_any_stage_is_one_line_and_the_resume_ends_the_same(
  tmp_path, smoke_run, smoke_data_dir, stage, name
):
  signum, status = SIGNALS[name]
  workdir = tmp_path / 'run'
  flags = [f'--config={SMOKE}', f'--workdir={workdir}',
           f'--config.data_dir={smoke_data_dir}']  # fmt: skip
  proc = subprocess.run(
    [sys.executable, '-c', DRIVER, stage, str(signum), *flags],
    cwd=ROOT, capture_output=True, text=True, timeout=300,
  )  # fmt: skip
  assert proc.returncode == status, proc.stderr[-3000:]
  assert 'Traceback' not in proc.stderr
  (line,) = [ln for ln in proc.stderr.splitlines() if ln.strip()]
  assert 'Run the same command to resume: python train.py' in line, line
  assert f'--workdir={workdir}' in line
  assert 'latest checkpoint: ' in line
  assert not (workdir / 'results.json').exists()
  resumed = train(workdir, smoke_data_dir)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  with open(os.path.join(smoke_run, 'results.json')) as f:
    whole = json.load(f)
  with open(workdir / 'results.json') as f:
    again = json.load(f)
  for key in ('best_step', 'val', 'test', 'test_last', 'last_step'):
    assert again.get(key) == whole.get(key), key


@pytest.mark.parametrize('name', ['SIGTERM', 'SIGHUP'])
def test_a_signal_while_the_program_loads_is_one_line(tmp_path, name):
  import signal  # pylint: disable=g-import-not-at-top
  import time  # pylint: disable=g-import-not-at-top

  signum, status = SIGNALS[name]
  proc = subprocess.Popen(
    [sys.executable, 'train.py', f'--config={SMOKE}',
     f'--workdir={tmp_path / "run"}'],
    cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
  )  # fmt: skip
  time.sleep(0.5)  # importing JAX
  proc.send_signal(signal.Signals(signum))
  _, err = proc.communicate(timeout=120)
  assert proc.returncode == status, err
  (line,) = err.strip().splitlines()
  assert line.startswith(f'Stopped ({name}). Run the same command again:')
  assert not (tmp_path / 'run').exists()
