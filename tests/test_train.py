"""train.py / eval.py end to end on smoke ListOps: contract files, exact
resume, eval equals training, 1 vs 4 devices, non-finite loss."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import chex
import jax
import numpy as np
import pytest
from test_errors import array_files

from configs import listops as listops_config
from lra import data as tasks
from lra.errors import UserError
from lra.report.tables import accuracy_table
from lra.train import batching, metrics, rundir, runtime, steps
from lra.train.build import create_state
from lra.train.metrics import read_rows

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMOKE = 'configs/listops.py:transformer,smoke'


@pytest.fixture(scope='module')
def data_dir(smoke_data_dir):
  return smoke_data_dir


def run(script, *args, check=True):
  proc = subprocess.run(
    [sys.executable, script, *args],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=300,
  )
  if check and proc.returncode != 0:
    raise AssertionError(f'{script} failed:\n{proc.stdout}\n{proc.stderr}')
  return proc


def train(workdir, data_dir, *extra, check=True):
  return run(
    'train.py',
    f'--config={SMOKE}',
    f'--workdir={workdir}',
    f'--config.data_dir={data_dir}',
    *extra,
    check=check,
  )


def strip_timing(rows):
  return [{k: v for k, v in r.items() if k != 'steps_per_sec'} for r in rows]


@pytest.fixture(scope='module')
def full_run(smoke_run):
  return smoke_run


def test_smoke_run_writes_the_contract_files(full_run):
  rows = read_rows(os.path.join(full_run, 'metrics.jsonl'))
  assert {r['split'] for r in rows} == {'train', 'val', 'test'}
  for r in rows:
    assert np.isfinite(r['loss']) and 0 <= r['accuracy'] <= 1
  results = json.load(open(os.path.join(full_run, 'results.json')))
  assert results['task'] == 'listops' and results['model'] == 'transformer'
  assert results['preset'] == 'smoke'
  # ListOps validates on its own split: the best-validation checkpoint is
  # reported; the final step's test accuracy is kept beside it.
  assert results['select'] == 'best_val' and results['last_step'] == 6
  assert results['data_source'] == 'generated'
  tests = {r['checkpoint']: r for r in rows if r['split'] == 'test'}
  assert tests['best']['step'] == results['best_step']
  assert tests['last']['step'] == 6
  assert tests['last']['accuracy'] == results['test_last']['accuracy']
  table = accuracy_table(full_run)
  row = [ln for ln in table.splitlines() if '[smoke]' in ln][0]
  # † : generated data; smoke scale: not beside the paper's 36.37.
  ours = f'{100 * results["test"]["accuracy"]:.2f}'
  assert row.startswith(f'| transformer [smoke] | smoke | {ours} † |')
  assert '36.37' not in row
  assert results['test']['count'] == 64 and results['val']['count'] == 64
  assert results['test_last']['count'] == 64
  best = [r for r in rows if r['split'] == 'val']
  assert results['best_step'] == max(best, key=lambda r: r['accuracy'])['step']
  assert os.listdir(os.path.join(full_run, 'checkpoints', 'latest'))
  config = json.load(open(os.path.join(full_run, 'config.json')))
  assert config['model']['attention']['name'] == 'softmax'


def test_steps_per_second_is_logged_at_every_train_row(full_run):
  rows = read_rows(os.path.join(full_run, 'metrics.jsonl'))
  rates = {r['step']: r['steps_per_sec'] for r in rows if r['split'] == 'train'}
  assert sorted(rates) == [2, 3, 4, 6]
  assert all(r is not None and r > 0 for r in rates.values()), rates


class VirtualClock:
  """time for lra.train.metrics: perf_counter reads a clock that only
  `spend` moves (everything else is the real module)."""

  def __init__(self):
    self.now = 0.0

  def spend(self, seconds):
    self.now += seconds

  def perf_counter(self):
    return self.now

  def __getattr__(self, name):
    return getattr(time, name)


def test_steps_per_second_counts_training_steps_only(
  tmp_path, monkeypatch, data_dir
):
  """On a virtual clock that compiling, evaluating and saving move by 1000 s
  each and a training step by 1 s (at its dispatch), no train row's steps/s
  holds any of the 1000 s: a row is written after the next step's dispatch,
  so its stretch reads 1-2 s per step (0.5-2 steps/s, or no time at all),
  where a stretch holding a compile or an evaluation would read under 0.003
  steps/s. (Before the fix the first
  row held the compilation and the one after an evaluation held it too;
  timed on the real clock this was a flaky test: an asynchronous save
  beside another test worker once slowed a smoke step 50 times.)"""
  from lra.train import loop  # pylint: disable=g-import-not-at-top

  clock = VirtualClock()
  monkeypatch.setattr(metrics, 'time', clock)
  make_trainer = loop.make_trainer

  def timed_trainer(*args, **kwargs):
    t, changes = make_trainer(*args, **kwargs)
    step, compiled = t.train_step, []

    def train_step(state, batch):
      out = step(state, batch)
      jax.block_until_ready(out)
      clock.spend(1.0 if compiled else 1000.0 + 1.0)
      compiled.append(True)
      return out

    t.train_step = train_step
    return t, changes

  evaluate, save = loop.Trainer.evaluate, loop.Checkpoints.save

  def slow_evaluate(self, *args, **kwargs):
    clock.spend(1000.0)
    return evaluate(self, *args, **kwargs)

  def slow_save(self, *args, **kwargs):
    clock.spend(1000.0)
    return save(self, *args, **kwargs)

  monkeypatch.setattr(loop, 'make_trainer', timed_trainer)
  monkeypatch.setattr(loop.Trainer, 'evaluate', slow_evaluate)
  monkeypatch.setattr(loop.Checkpoints, 'save', slow_save)
  config = listops_config.get_config('transformer,smoke')
  config.data_dir = data_dir
  # Evaluations at 3 and 6, saves at 4 and 6: each resumes the timer itself.
  config.log_every_steps, config.eval_every_steps = 2, 3
  config.checkpoint_every_steps = 4
  workdir = str(tmp_path / 'run')
  loop.train_and_evaluate(config, workdir)
  rows = read_rows(os.path.join(workdir, 'metrics.jsonl'))
  rates = {r['step']: r['steps_per_sec'] for r in rows if r['split'] == 'train'}
  assert sorted(rates) == [2, 3, 4, 6]
  # 6 s of training; the rest compiling, evaluating and saving.
  assert clock.now > 5000
  assert all(r is not None for r in rates.values()), rates
  assert min(rates.values()) >= 0.5, rates


def test_killed_and_resumed_run_ends_exactly_like_uninterrupted(
  tmp_path, data_dir, full_run
):
  workdir = str(tmp_path / 'killed')
  proc = train(workdir, data_dir, '--stop_after_steps=4', check=False)
  assert proc.returncode == 3, proc.stderr
  assert not os.path.exists(os.path.join(workdir, 'results.json'))
  # The same command again resumes from step 3; here with the batches made
  # on the worker thread and transferred there (CPU default: in the loop's
  # thread, placed by the step), which changes no number.
  train(workdir, data_dir, '--config.prefetch=2')
  a = json.load(open(os.path.join(full_run, 'results.json')))
  b = json.load(open(os.path.join(workdir, 'results.json')))
  assert a == b
  rows_a = read_rows(os.path.join(full_run, 'metrics.jsonl'))
  rows_b = read_rows(os.path.join(workdir, 'metrics.jsonl'))
  assert strip_timing(rows_a) == strip_timing(rows_b)


def test_damaged_checkpoints_are_skipped_and_the_run_finishes_the_same(
  tmp_path, data_dir, full_run
):
  """A truncated array file in the newest saves: a warning names each one,
  the run resumes from the newest readable save and ends like the original."""
  workdir = str(tmp_path / 'damaged')
  shutil.copytree(full_run, workdir)
  os.remove(os.path.join(workdir, 'results.json'))
  damaged = [os.path.join(workdir, 'checkpoints', 'latest', '6')]
  best = os.path.join(workdir, 'checkpoints', 'best', '6')
  damaged += [best] if os.path.exists(best) else []
  for step_dir in damaged:
    for path in array_files(step_dir):
      with open(path, 'r+b') as f:
        f.truncate(os.path.getsize(path) // 3)
  proc = train(workdir, data_dir)
  assert 'Traceback' not in proc.stderr
  warnings = [ln for ln in proc.stderr.splitlines() if ln.startswith('warn')]
  assert any('latest checkpoint at step 6' in w for w in warnings), warnings
  assert 'resuming from the latest checkpoint at step 3' in proc.stderr
  assert f'Resuming {workdir} from step 3.' in proc.stdout
  a = json.load(open(os.path.join(full_run, 'results.json')))
  b = json.load(open(os.path.join(workdir, 'results.json')))
  assert a == b
  unreadable = os.listdir(os.path.join(workdir, 'checkpoints', 'unreadable'))
  assert 'latest_6' in unreadable and len(unreadable) == len(damaged)


def test_eval_equals_training_evaluation(full_run, data_dir):
  run('eval.py', f'--workdir={full_run}', '--split=test')
  ev = json.load(open(os.path.join(full_run, 'eval_test_best.json')))
  res = json.load(open(os.path.join(full_run, 'results.json')))
  assert ev['step'] == res['best_step']
  assert ev['accuracy'] == res['test']['accuracy']
  assert ev['loss'] == pytest.approx(res['test']['loss'], rel=1e-6)
  run('eval.py', f'--workdir={full_run}', '--split=val', '--step=6')
  ev = json.load(open(os.path.join(full_run, 'eval_val_step6.json')))
  val6 = [
    r
    for r in read_rows(os.path.join(full_run, 'metrics.jsonl'))
    if r['split'] == 'val' and r['step'] == 6
  ][0]
  assert ev['accuracy'] == val6['accuracy'] and ev['count'] == val6['count']
  assert ev['loss'] == pytest.approx(val6['loss'], rel=1e-6)


def test_resuming_with_a_different_config_is_refused(full_run, data_dir):
  proc = train(full_run, data_dir, '--config.seed=7', check=False)
  assert proc.returncode == 2 and 'Traceback' not in proc.stderr
  assert 'seed differ' in proc.stderr and 'use a new --workdir' in proc.stderr


def test_config_mismatch_names_leaf_keys_and_allows_optimiser_changes(
  full_run,
):
  config = listops_config.get_config('transformer,smoke')
  config.model.num_layers = 2
  config.model.attention.implementation = 'fused'
  with pytest.raises(UserError, match=r'\(model\.attention\.implementation, '):
    rundir.check_resume(config, full_run)
  config = listops_config.get_config('transformer,smoke')
  config.learning_rate, config.grad_clip_norm = 1e-4, 1.0
  assert rundir.check_resume(config, full_run) == {
    'grad_clip_norm': (0.0, 1.0),
    'learning_rate': (0.05, 1e-4),
  }


def test_one_device_step_equals_four_device_step(data_dir):
  assert jax.device_count() == 4
  config = listops_config.get_config('transformer,smoke')
  config.data_dir = data_dir
  task = tasks.get_task('listops')
  inputs, labels = runtime.load_data(config, task, progress=False)['train']
  batch = batching.train_batch(
    inputs, labels, seed=0, step=0, global_batch=8, length=config.max_length
  )
  results = []
  for devices in (jax.devices()[:1], jax.devices()):
    replicated, batch_sharding = runtime.make_mesh(devices)
    key = jax.random.key(5)  # made under the mesh it is used with
    graphdef, state = create_state(config, task, replicated)
    step = steps.make_train_step(graphdef)
    state, metrics = step(state, runtime.to_device(batch, batch_sharding), key)
    assert len(metrics['loss'].sharding.device_set) == len(devices)
    results.append((jax.device_get(state), jax.device_get(metrics)))
  (s1, m1), (s4, m4) = results
  np.testing.assert_allclose(m1['loss'], m4['loss'], rtol=1e-5)
  chex.assert_trees_all_close(s1, s4, rtol=1e-4, atol=1e-6)


def test_the_step_draws_the_key_the_loop_used_to_pass(data_dir):
  """make_train_step(seed=...) called without a key draws step s's key,
  step_key(seed, s) with s = the optimizer's count + 1, inside the step:
  the same state as passing that key, step after step (so a run keeps
  its numbers), with the host batch placed by the step (in_shardings)."""
  config = listops_config.get_config('transformer,smoke')
  config.data_dir = data_dir
  config.model.dropout_rate = 0.3  # the key matters
  task = tasks.get_task('listops')
  inputs, labels = runtime.load_data(config, task, progress=False)['train']
  replicated, batch_sharding = runtime.make_mesh()
  graphdef, a = create_state(config, task, replicated)
  given = steps.make_train_step(graphdef)
  drawn = steps.make_train_step(
    graphdef, seed=7, shardings=(replicated, batch_sharding)
  )
  b = create_state(config, task, replicated)[1]
  other = create_state(config, task, replicated)[1]
  for s in (1, 2, 3):
    batch = batching.train_batch(
      inputs,
      labels,
      seed=0,
      step=s - 1,
      global_batch=8,
      length=config.max_length,
    )
    placed = runtime.to_device(batch, batch_sharding)
    a, ma = given(a, placed, steps.step_key(7, s))
    b, mb = drawn(b, batch)  # host arrays
    assert jax.device_get(ma) == jax.device_get(mb)
    other, mo = given(other, placed, steps.step_key(8, s))
    assert mo['loss'] != ma['loss']  # another seed's dropout
  chex.assert_trees_all_equal(jax.device_get(a), jax.device_get(b))


def test_non_finite_loss_stops_and_keeps_last_good_checkpoint(
  tmp_path, data_dir
):
  workdir = str(tmp_path / 'nan')
  proc = train(
    workdir,
    data_dir,
    '--config.learning_rate=1e30',
    '--config.schedule=constant',
    '--config.warmup_steps=1000',
    '--config.checkpoint_every_steps=1',
    check=False,
  )
  assert proc.returncode != 0
  err = proc.stderr.strip().splitlines()[-1]
  assert err.startswith('error: Training stopped: the ')
  assert 'loss is not finite' in err or 'parameters diverged' in err
  step = int(err.split('at step ')[1].split(';')[0])
  assert f'last good checkpoint is step {step - 1}' in err
  assert 'Traceback' not in proc.stderr
  saved = os.listdir(os.path.join(workdir, 'checkpoints', 'latest'))
  assert str(step - 1) in saved and str(step) not in saved
  assert 'run the same command with a lower --config.learning_rate' in err
  # The advice can be followed: the same command with a lower learning rate
  # resumes from the last good checkpoint and records the change.
  proc = train(
    workdir,
    data_dir,
    '--config.learning_rate=0.001',
    '--config.schedule=constant',
    '--config.warmup_steps=1000',
    '--config.checkpoint_every_steps=1',
  )
  assert f'Resuming {workdir} from step {step - 1}.' in proc.stdout
  config = json.load(open(os.path.join(workdir, 'config.json')))
  assert config['learning_rate'] == 0.001
  assert config['resume_changes'] == [
    {'step': step - 1, 'changes': {'learning_rate': [1e30, 0.001]}}
  ]
  rows = read_rows(os.path.join(workdir, 'metrics.jsonl'))
  assert {
    'step': step - 1,
    'split': 'config',
    'changes': {'learning_rate': [1e30, 0.001]},
  } in rows
  assert os.path.exists(os.path.join(workdir, 'results.json'))


def test_bfloat16_and_accumulated_steps_train(data_dir):
  """bf16 compute keeps f32 params and a finite f32 loss; MultiSteps only
  applies the update every k-th step."""
  config = listops_config.get_config('transformer,smoke')
  config.data_dir = data_dir
  config.dtype = 'bfloat16'
  config.grad_accum_steps = 2
  task = tasks.get_task('listops')
  inputs, labels = runtime.load_data(config, task, progress=False)['train']
  replicated, batch_sharding = runtime.make_mesh()
  graphdef, state = create_state(config, task, replicated)
  step = steps.make_train_step(graphdef)
  params = lambda s: jax.device_get(s[0])  # noqa: E731  the model's state
  before = jax.tree.leaves(params(state))
  seen = []
  for i in range(4):
    batch = batching.train_batch(
      inputs, labels, seed=0, step=i, global_batch=8, length=config.max_length
    )
    state, m = step(
      state, runtime.to_device(batch, batch_sharding), jax.random.key(i)
    )
    assert m['loss'].dtype == np.float32 and np.isfinite(m['loss'])
    seen.append(jax.tree.leaves(params(state)))
  assert all(p.dtype == np.float32 for p in before)
  same = lambda x, y: all(np.array_equal(a, b) for a, b in zip(x, y))  # noqa: E731
  # Odd micro-steps only accumulate. The first real update (after micro-step
  # 2) has learning rate 0, as the warmup schedules start at 0 (as LRA's).
  assert same(before, seen[0]) and same(seen[1], seen[2])
  assert not same(seen[2], seen[3])


@pytest.mark.slow
def test_ctrl_c_saves_a_resumable_checkpoint(tmp_path, data_dir):
  workdir = tmp_path / 'interrupted'
  proc = subprocess.Popen(
    [
      sys.executable,
      'train.py',
      f'--config={SMOKE}',
      f'--workdir={workdir}',
      f'--config.data_dir={data_dir}',
      '--config.num_train_steps=100000',
      '--config.eval_every_steps=100000',
      '--config.checkpoint_every_steps=100000',
      '--config.log_every_steps=5',
    ],
    cwd=ROOT,
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
  )
  metrics = workdir / 'metrics.jsonl'
  deadline = time.time() + 120
  while not (metrics.exists() and metrics.read_text().strip()):
    assert time.time() < deadline and proc.poll() is None
    time.sleep(0.2)
  proc.send_signal(signal.SIGINT)
  _, err = proc.communicate(timeout=120)
  assert proc.returncode == 130, err
  assert 'Traceback' not in err
  last = err.strip().splitlines()[-1]
  assert last.startswith('Interrupted; latest checkpoint: step ')
  step = int(last.split('step ')[1].split('.')[0])
  assert step >= 5
  assert os.listdir(workdir / 'checkpoints' / 'latest') == [str(step)]
  run('eval.py', f'--workdir={workdir}', '--which=latest', '--split=val')
  assert json.load(open(workdir / 'eval_val_latest.json'))['step'] == step


def test_sigterm_saves_and_the_run_resumes_exactly(tmp_path, data_dir):
  """Preemption (SIGTERM: clouds, Slurm, Kubernetes) is handled like Ctrl-C:
  the step finishes, a checkpoint is saved, the exit status is 143 with a
  'Preempted' sentence; the same command resumes and ends exactly like a
  run that was never stopped."""
  common = [
    f'--config.data_dir={data_dir}',
    '--config.eval_every_steps=100000',
    '--config.checkpoint_every_steps=100000',
    '--config.log_every_steps=5',
  ]
  workdir = tmp_path / 'preempted'
  proc = subprocess.Popen(
    [
      sys.executable,
      'train.py',
      f'--config={SMOKE}',
      f'--workdir={workdir}',
      '--config.num_train_steps=100000',
      *common,
    ],
    cwd=ROOT,
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
  )
  metrics = workdir / 'metrics.jsonl'
  deadline = time.time() + 120
  while not (metrics.exists() and metrics.read_text().strip()):
    assert time.time() < deadline and proc.poll() is None
    time.sleep(0.2)
  proc.send_signal(signal.SIGTERM)
  _, err = proc.communicate(timeout=120)
  assert proc.returncode == 143, err
  assert 'Traceback' not in err
  last = err.strip().splitlines()[-1]
  assert last.startswith('Preempted (SIGTERM); latest checkpoint: step ')
  step = int(last.split('step ')[1].split('.')[0])
  end = f'--config.num_train_steps={step + 3}'
  train(str(workdir), data_dir, end, *common[1:])
  whole = str(tmp_path / 'whole')
  train(whole, data_dir, end, *common[1:])
  a = json.load(open(os.path.join(whole, 'results.json')))
  b = json.load(open(workdir / 'results.json'))
  assert a == b and a['last_step'] == step + 3


def test_killed_while_a_save_is_written_resumes_exactly(
  tmp_path, data_dir, full_run
):
  """Checkpoints are written asynchronously: killed (os._exit) right after
  the step-3 save started, the run leaves no half-written save as a
  readable step, and the same command ends exactly like the full run."""
  workdir = str(tmp_path / 'killed_saving')
  proc = train(workdir, data_dir, '--stop_after_steps=3', check=False)
  assert proc.returncode == 3, proc.stderr
  saved = os.listdir(os.path.join(workdir, 'checkpoints', 'latest'))
  assert all(not n.isdigit() or n == '3' for n in saved), saved
  train(workdir, data_dir)
  a = json.load(open(os.path.join(full_run, 'results.json')))
  b = json.load(open(os.path.join(workdir, 'results.json')))
  assert a == b


def test_a_failed_save_is_one_sentence_and_keeps_the_previous(
  tmp_path, data_dir, monkeypatch
):
  """A save that cannot be written (no space left) stops the run with one
  sentence; the previous checkpoint stays readable and resumable."""
  import errno  # pylint: disable=g-import-not-at-top

  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top

  import train as train_module  # pylint: disable=g-import-not-at-top

  config = listops_config.get_config('transformer,smoke')
  config.data_dir = data_dir
  real_wait = ocp.CheckpointManager.wait_until_finished

  def wait(self):
    real_wait(self)
    folder = str(self.directory)
    if folder.endswith('latest') and '6' in os.listdir(folder):
      raise OSError(errno.ENOSPC, 'No space left on device')  # the step-6 save

  monkeypatch.setattr(ocp.CheckpointManager, 'wait_until_finished', wait)
  workdir = str(tmp_path / 'full_disk')
  with pytest.raises(UserError) as e:
    train_module.train_and_evaluate(config, workdir)
  message = str(e.value)
  assert 'no space left on device' in message and '\n' not in message
  assert 'previous latest checkpoint (step 3) is intact' in message
  monkeypatch.setattr(ocp.CheckpointManager, 'wait_until_finished', real_wait)
  from lra.train.checkpoints import Checkpoints  # pylint: disable=g-import-not-at-top

  _, state = create_state(config, tasks.get_task('listops'), None)
  ckpt = Checkpoints(workdir)
  _, meta = ckpt.restore('latest', 3, state)
  ckpt.close()
  assert meta['step'] == 3
