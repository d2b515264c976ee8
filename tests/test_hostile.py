"""Hostile and careless input: what is never kept, what refuses in one
sentence, what a damaged log costs (nothing).

- a diverged run keeps no non-finite checkpoint: lr 1e6 stops, names the
  last finite checkpoint, and the same workdir resumed at 1e-3 finishes
  with finite results;
- one training per workdir (a held lock refuses in one sentence naming
  the holder);
- a torn last line of metrics.jsonl is skipped with a warning;
- a cache whose token ids or labels are out of range names the file and
  the first bad record;
- a stray positional argument is one `error:` line.
"""

import json
import math
import os
import subprocess
import sys

from conftest import ROOT, SMOKE
import numpy as np
import pytest

from lra import data as tasks
from lra.errors import UserError
from lra.train import lock, runtime
from lra.train.metrics import read_rows


def train(workdir, data_dir, *flags, timeout=300):
  return subprocess.run(
    [
      sys.executable,
      'train.py',
      f'--config={SMOKE}',
      f'--workdir={workdir}',
      f'--config.data_dir={data_dir}',
      *flags,
    ],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=timeout,
  )


def test_diverged_steps_are_never_kept_and_a_lower_rate_recovers(
  tmp_path, smoke_data_dir
):
  workdir = str(tmp_path / 'run')
  # Saves every 2 steps, evaluations every 2: a diverged step would be
  # saved and chosen as best if nothing checked it.
  every = ['--config.checkpoint_every_steps=2', '--config.eval_every_steps=2']
  proc = train(workdir, smoke_data_dir, '--config.learning_rate=1e6', *every)
  assert proc.returncode == 2, proc.stderr
  line = 'error:' + proc.stderr.split('error:')[-1].strip()
  assert 'not finite' in line or 'diverged' in line, line
  folder = os.path.join(workdir, 'checkpoints', 'latest')
  kept = [int(s) for s in os.listdir(folder)] if os.path.isdir(folder) else []
  if kept:  # the message names the newest kept (finite) checkpoint
    assert f'last good checkpoint is step {max(kept)}' in line, line
  else:
    assert 'no checkpoint had been saved yet' in line, line
  vals = [r for r in read_rows(os.path.join(workdir, 'metrics.jsonl'))]
  assert all(
    math.isfinite(r['loss']) for r in vals if r['split'] in ('val', 'train')
  )
  proc = train(workdir, smoke_data_dir, '--config.learning_rate=1e-3', *every)
  assert proc.returncode == 0, proc.stderr[-3000:]
  results = json.load(open(os.path.join(workdir, 'results.json')))
  assert math.isfinite(results['test']['loss'])
  assert math.isfinite(results['val']['loss'])


def test_a_held_workdir_refuses_a_second_training(tmp_path, smoke_data_dir):
  workdir = str(tmp_path / 'run')
  with lock.workdir_lock(workdir):
    proc = train(workdir, smoke_data_dir)
  assert proc.returncode == 2
  (line,) = proc.stderr.strip().splitlines()[-1:]
  assert line.startswith('error: ') and 'in use by another training' in line
  assert f'process {os.getpid()}' in line
  assert not os.path.exists(os.path.join(workdir, 'metrics.jsonl'))
  # Released with its holder: the same command now trains.
  assert train(workdir, smoke_data_dir).returncode == 0


def test_torn_last_line_is_skipped_with_a_warning(tmp_path, capsys):
  path = str(tmp_path / 'metrics.jsonl')
  with open(path, 'w') as f:
    f.write(json.dumps({'step': 1, 'split': 'train', 'loss': 1.0}) + '\n')
    f.write('{"step": 2, "split": "tr')
  assert read_rows(path) == [{'step': 1, 'split': 'train', 'loss': 1.0}]
  err = capsys.readouterr().err
  assert err.startswith('warning: ') and 'line 2' in err


def test_resume_after_a_torn_log_line(tmp_path, smoke_run, smoke_data_dir):
  import shutil  # pylint: disable=g-import-not-at-top

  workdir = str(tmp_path / 'run')
  shutil.copytree(smoke_run, workdir)
  os.remove(os.path.join(workdir, 'results.json'))
  with open(os.path.join(workdir, 'metrics.jsonl'), 'a') as f:
    f.write('{"step": 7, "spl')
  plot = subprocess.run(
    [sys.executable, 'eval.py', f'--plot={workdir}'],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert plot.returncode == 0, plot.stderr[-2000:]
  assert 'warning:' in plot.stderr and 'Traceback' not in plot.stderr


@pytest.mark.parametrize('what', ['token', 'label'])
def test_out_of_range_cache_names_the_file_and_record(what):
  task = tasks.get_task('listops')
  inputs = np.zeros((4, 8), np.int16)
  labels = np.zeros((4,), np.int64)
  if what == 'token':
    inputs[2, 5] = task.vocab_size + 3
  else:
    labels[1] = task.num_classes
  splits = {'train': (inputs, labels), 'val': (inputs[:1], labels[:1])}
  with pytest.raises(UserError) as e:
    runtime.check_ranges(task, {}, splits, '/data/x', 'python -m x')
  text = str(e.value)
  if what == 'token':
    assert '/data/x/train_inputs.npy: record 2 has token id' in text
    assert str(task.vocab_size + 3) in text
  else:
    assert '/data/x/train_labels.npy: record 1 has label' in text
  assert '--force' in text


def test_per_position_ignore_labels_are_in_range():
  task = tasks.get_task('mqar')
  opts = {'vocab_size': 64}
  inputs = np.ones((2, 8), np.int64)
  labels = np.full((2, 8), -100, np.int64)
  labels[0, 3] = 40
  runtime.check_ranges(task, opts, {'train': (inputs, labels)}, '/d', 'c')


def assert_stray_argument_is_one_line(args):
  """The entry point given a stray positional 'extra': exit 2 and one
  sentence on stderr, no traceback."""
  proc = subprocess.run(
    [sys.executable, *args, 'extra'],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert proc.returncode == 2
  assert proc.stderr.strip().splitlines() == [
    "error: unexpected argument 'extra'; flags are written --name=value "
    '(see --help).'
  ]


def test_stray_argument_is_one_line(tmp_path):
  assert_stray_argument_is_one_line(
    ['train.py', f'--config={SMOKE}', '--workdir=x']
  )


def test_a_full_disk_at_a_log_write_is_one_sentence_then_resumes(
  tmp_path, smoke_data_dir, monkeypatch
):
  import errno  # pylint: disable=g-import-not-at-top

  from configs import listops  # pylint: disable=g-import-not-at-top
  from lra.train.metrics import MetricsLog  # pylint: disable=g-import-not-at-top
  import train as train_entry  # pylint: disable=g-import-not-at-top

  config = listops.get_config('transformer,smoke')
  config.data_dir = smoke_data_dir
  config.log_every_steps = 1
  config.checkpoint_every_steps = 2
  workdir = str(tmp_path / 'run')
  original = MetricsLog.write

  def full(self, step, split, **row):
    if split == 'train' and step >= 4:
      raise OSError(errno.ENOSPC, 'No space left on device')
    return original(self, step, split, **row)

  monkeypatch.setattr(MetricsLog, 'write', full)
  with pytest.raises(UserError, match='no space left on device') as e:
    train_entry.train_and_evaluate(config, workdir)
  assert 'run the same command to resume' in str(e.value)
  monkeypatch.setattr(MetricsLog, 'write', original)
  results = train_entry.train_and_evaluate(config, workdir)
  assert math.isfinite(results['test']['loss'])


def test_checkpoints_of_another_model_are_refused_and_kept(
  tmp_path, smoke_run, smoke_data_dir
):
  import shutil  # pylint: disable=g-import-not-at-top

  workdir = str(tmp_path / 'run')
  shutil.copytree(smoke_run, workdir)
  for name in ('config.json', 'results.json'):
    os.remove(os.path.join(workdir, name))
  before = sorted(os.listdir(os.path.join(workdir, 'checkpoints', 'latest')))
  proc = train(
    workdir,
    smoke_data_dir,
    '--config.model.emb_dim=32',
    '--config.model.qkv_dim=32',
  )
  assert proc.returncode == 2
  line = proc.stderr.strip().splitlines()[-1]
  assert line.startswith('error: ') and 'saved by another model' in line
  assert 'Traceback' not in proc.stderr
  after = sorted(os.listdir(os.path.join(workdir, 'checkpoints', 'latest')))
  assert before == after
  assert not os.path.exists(os.path.join(workdir, 'checkpoints', 'unreadable'))


@pytest.mark.parametrize(
  'args, says',
  [
    (['--seed', '-3'], 'seed must be an integer in [0, 2**32), got -3'),
    (['--option', 'seed=x1'], "got 'x1'"),
    (['--seed', 'abc'], "argument --seed: invalid int value: 'abc'"),
  ],
)
def test_prepare_bad_seed_is_one_line_and_writes_nothing(tmp_path, args, says):
  proc = subprocess.run(
    [sys.executable, '-m', 'lra.data.prepare', 'listops', '--small',
     f'--data_dir={tmp_path}', *args],
    cwd=ROOT, capture_output=True, text=True, timeout=120,
  )  # fmt: skip
  assert proc.returncode == 2
  (line,) = proc.stderr.strip().splitlines()
  assert line.startswith('error: ') and says in line, line
  assert not any(p.name.endswith('.tmp') for p in tmp_path.rglob('*'))


def test_eval_on_a_read_only_run_keeps_the_numbers(smoke_run, monkeypatch):
  import errno  # pylint: disable=g-import-not-at-top

  from lra.report import eval_main as evaluate

  def read_only(path, obj):
    raise OSError(errno.EROFS, 'Read-only file system', path)

  monkeypatch.setattr(evaluate, 'write_json', read_only)
  r = evaluate.evaluate_checkpoint(
    smoke_run, 'test', None, 'best', None, None, []
  )
  assert 0.0 <= r['accuracy'] <= 1.0
  assert 'Read-only file system' in r['write_error']
  assert 'the numbers above are not saved' in r['write_error']


def test_ctrl_c_twice_in_training_and_once_in_eval_are_clean(
  tmp_path, smoke_run, smoke_data_dir
):
  import signal  # pylint: disable=g-import-not-at-top
  import time  # pylint: disable=g-import-not-at-top

  workdir = tmp_path / 'run'
  proc = subprocess.Popen(
    [sys.executable, 'train.py', f'--config={SMOKE}', f'--workdir={workdir}',
     f'--config.data_dir={smoke_data_dir}', '--config.num_train_steps=100000',
     '--config.eval_every_steps=100000', '--config.log_every_steps=5',
     '--config.checkpoint_every_steps=100000'],
    cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
  )  # fmt: skip
  metrics = workdir / 'metrics.jsonl'
  deadline = time.time() + 120
  while not (metrics.exists() and metrics.read_text().strip()):
    assert time.time() < deadline and proc.poll() is None
    time.sleep(0.2)
  proc.send_signal(signal.SIGINT)
  proc.send_signal(signal.SIGINT)
  _, err = proc.communicate(timeout=120)
  assert proc.returncode == 130, err
  assert 'Traceback' not in err
  # Before the loop's handler (imports, start-up): one line too.
  proc = subprocess.Popen(
    [sys.executable, 'eval.py', f'--workdir={smoke_run}'],
    cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
  )  # fmt: skip
  time.sleep(1.0)
  proc.send_signal(signal.SIGINT)
  _, err = proc.communicate(timeout=120)
  assert proc.returncode in (130, 0), err  # 0: it finished first
  assert 'Traceback' not in err


def test_out_of_memory_is_one_sentence_and_leaves_no_workdir(
  tmp_path, smoke_data_dir, monkeypatch
):
  from configs import listops  # pylint: disable=g-import-not-at-top
  from lra.train import loop  # pylint: disable=g-import-not-at-top
  import train as train_entry  # pylint: disable=g-import-not-at-top

  config = listops.get_config('transformer,smoke')
  config.data_dir = smoke_data_dir
  workdir = str(tmp_path / 'new_run')

  def exhausted(*args, **kwargs):
    raise RuntimeError(
      'RESOURCE_EXHAUSTED: Out of memory while trying to allocate 42.0GiB.'
    )

  monkeypatch.setattr(loop, 'run', exhausted)
  with pytest.raises(UserError, match='does not fit in memory') as e:
    train_entry.train_and_evaluate(config, workdir)
  assert '--config.batch_size' in str(e.value)
  assert not os.path.exists(workdir)


def test_stray_argument_to_eval_is_one_line(smoke_run):
  assert_stray_argument_is_one_line(['eval.py', f'--workdir={smoke_run}'])
