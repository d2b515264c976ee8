"""Multi-process training and evaluation on loopback (issue 14).

Two processes x 2 fake CPU devices each (gloo collectives) against one
process x 4 fake devices (the session's smoke run): the same parameters,
metrics and results; a killed two-process run resumes from its own
checkpoint; eval.py agrees; a failure in one process ends both with its
message; a process whose peers never come stops after --distributed_timeout.
Every launch has a timeout, so a hang fails the test instead of CI.
"""

import json
import os
import socket
import subprocess
import sys

from conftest import ROOT, SMOKE
import jax
import numpy as np
import pytest

from lra import data as tasks
from lra.errors import UserError
from lra.train import batching, processes, runtime
from lra.train.checkpoints import Checkpoints
from lra.train.metrics import read_rows

TIMEOUT_S = 240


def free_port():
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def launch(
  script, *args, n=2, per_process=None, timeout=TIMEOUT_S, num_processes=None
):
  """Runs `script` as n processes on loopback; [(rc, stdout, stderr)]. A
  process still running after `timeout` s fails the test (all are killed)."""
  env = dict(os.environ, JAX_PLATFORMS='cpu')
  env['XLA_FLAGS'] = '--xla_force_host_platform_device_count=2'
  port = free_port()
  procs = [
    subprocess.Popen(
      [
        sys.executable,
        script,
        *args,
        *(per_process(i) if per_process else []),
        f'--coordinator_address=127.0.0.1:{port}',
        f'--num_processes={num_processes or n}',
        f'--process_id={i}',
      ],
      cwd=ROOT,
      env=env,
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      text=True,
    )
    for i in range(n)
  ]
  out = []
  try:
    for p in procs:
      stdout, stderr = p.communicate(timeout=timeout)
      out.append((p.returncode, stdout, stderr))
  except subprocess.TimeoutExpired:
    for p in procs:
      p.kill()
    pytest.fail(f'{script} with {n} processes hung for {timeout} s')
  return out


def assert_close(a, b, path=''):
  """Equal structure; floats to float32 rounding (the cross-process sums
  are added in another order), everything else exactly."""
  if isinstance(a, dict):
    assert sorted(a) == sorted(b), path
    for k in a:
      if k != 'steps_per_sec':
        assert_close(a[k], b[k], f'{path}.{k}')
  elif isinstance(a, float) and not float(a).is_integer():
    assert np.isclose(a, b, rtol=1e-5, atol=1e-6), (path, a, b)
  else:
    assert a == b, (path, a, b)


@pytest.fixture(scope='module')
def two_process_run(tmp_path_factory, smoke_data_dir):
  """The smoke run by two processes, killed after step 4 (its latest
  checkpoint is step 3), then resumed by the same command."""
  workdir = str(tmp_path_factory.mktemp('two_process'))
  args = [
    f'--config={SMOKE}',
    f'--workdir={workdir}',
    f'--config.data_dir={smoke_data_dir}',
  ]
  killed = launch('train.py', *args, '--stop_after_steps=4')
  saved = sorted(os.listdir(os.path.join(workdir, 'checkpoints', 'latest')))
  resumed = launch('train.py', *args)
  return workdir, killed, saved, resumed


@pytest.mark.slow
def test_two_processes_train_and_resume_like_one(two_process_run, smoke_run):
  workdir, killed, saved, resumed = two_process_run
  assert [rc for rc, _, _ in killed] == [3, 3], killed[0][2][-2000:]
  assert saved == ['3']
  assert [rc for rc, _, _ in resumed] == [0, 0], resumed[0][2][-2000:]
  # Process 0 alone prints, draws the bar and writes the logs.
  assert f'Resuming {workdir} from step 3.' in resumed[0][1]
  assert 'best step 6' in resumed[0][1]
  for _, stdout, stderr in resumed[1:]:
    assert 'Resuming' not in stdout and 'best step' not in stdout
    assert 'train step' not in stdout + stderr and 'val:' not in stderr
  load = lambda d: json.load(open(os.path.join(d, 'results.json')))  # noqa: E731
  assert_close(load(workdir), load(smoke_run))
  rows = lambda d: read_rows(os.path.join(d, 'metrics.jsonl'))  # noqa: E731
  assert len(rows(workdir)) == len(rows(smoke_run))
  for a, b in zip(rows(workdir), rows(smoke_run)):
    assert_close(a, b)
  # The final parameters and optimizer state, restored here (4 devices).
  import ml_collections  # pylint: disable=g-import-not-at-top

  from lra.train.build import create_state  # pylint: disable=g-import-not-at-top

  config = ml_collections.ConfigDict(
    json.load(open(os.path.join(workdir, 'config.json')))
  )
  replicated, _ = runtime.make_mesh()
  _, state = create_state(config, tasks.get_task('listops'), replicated)
  states = []
  for d in (workdir, smoke_run):
    ckpt = Checkpoints(d)
    states.append(jax.device_get(ckpt.restore('latest', 6, state)[0]))
    ckpt.close()
  leaves = [jax.tree.leaves(s) for s in states]
  assert len(leaves[0]) == len(leaves[1]) > 0
  for a, b in zip(*leaves):
    np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-6)


def test_eval_with_two_processes_counts_each_example_once(
  two_process_run, smoke_run
):
  workdir = two_process_run[0]
  out = launch('eval.py', f'--workdir={workdir}', '--split=test')
  assert [rc for rc, _, _ in out] == [0, 0], out[0][2][-2000:]
  assert 'over 64 examples' in out[0][1] and 'accuracy' not in out[1][1]
  result = json.load(open(os.path.join(workdir, 'eval_test_best.json')))
  results = json.load(open(os.path.join(workdir, 'results.json')))
  assert result['count'] == 64
  assert result['accuracy'] == results['test']['accuracy']
  one = json.load(open(os.path.join(smoke_run, 'results.json')))['test']
  assert_close({k: result[k] for k in one}, one)


def test_a_failure_in_one_process_ends_both_with_its_message(
  tmp_path, smoke_data_dir
):
  bad = lambda i: ['--config.data_dir=/dev/null/x'] if i else []  # noqa: E731
  out = launch(
    'train.py',
    f'--config={SMOKE}',
    f'--workdir={tmp_path}/w',
    f'--config.data_dir={smoke_data_dir}',
    per_process=bad,
    timeout=60,
  )
  assert [rc for rc, _, _ in out] == [2, 2]
  message = out[1][2].strip().splitlines()[-1]
  assert message.startswith('error: --config.data_dir /dev/null/x')
  assert out[0][2].strip().splitlines()[-1] == message.replace(
    'error: ', 'error: stopped: process 1: ', 1
  )
  assert 'Traceback' not in out[0][2] + out[1][2]


def test_a_process_without_its_peers_stops_after_the_timeout(tmp_path):
  out = launch(
    'train.py',
    f'--config={SMOKE}',
    f'--workdir={tmp_path}/w',
    '--distributed_timeout=2',
    n=1,
    num_processes=2,
    timeout=60,
  )
  ((rc, _, stderr),) = out
  assert rc == 2
  assert (
    stderr.strip()
    .splitlines()[-1]
    .startswith('error: the 2 processes of coordinator 127.0.0.1:')
  )
  assert not os.path.exists(tmp_path / 'w')


def test_process_flags_all_three_or_none():
  with pytest.raises(UserError, match='all three'):
    processes.initialize('127.0.0.1:1234', 2, None)
  with pytest.raises(UserError, match='not HOST:PORT'):
    processes.initialize('localhost', 2, 0)
  with pytest.raises(UserError, match='not in 0..1'):
    processes.initialize('127.0.0.1:1234', 2, 2)
  assert processes.initialize() == 1  # neither: one process, nothing done


@pytest.mark.parametrize('count', [2, 4])
def test_process_rows_are_disjoint_and_cover_each_batch(count):
  inputs = np.arange(37 * 3).reshape(37, 3)
  labels = np.arange(37)
  train = [
    batching.train_batch(
      inputs,
      labels,
      seed=1,
      step=5,
      global_batch=8,
      length=3,
      process_index=i,
      process_count=count,
    )['labels']
    for i in range(count)
  ]
  whole = batching.train_batch(
    inputs, labels, seed=1, step=5, global_batch=8, length=3
  )['labels']
  # The rows of one process's batch, in the one-process batch's order.
  np.testing.assert_array_equal(np.concatenate(train), whole)
  seen = []
  for i in range(count):
    for b in batching.eval_batches(
      inputs,
      labels,
      global_batch=8,
      length=3,
      process_index=i,
      process_count=count,
    ):
      seen += list(b['labels'][b['weights'] > 0])
  assert sorted(seen) == list(range(37))  # each example once, padding off
