"""What a training run shows while it runs (lra/train/progress.py): on a
terminal, a bar whose ETA follows the measured step rate at every update;
on a file or a pipe, plain lines every so often, with no carriage return or
cursor code."""

import io
import os
import re
import subprocess
import sys
import time

import ml_collections
import numpy as np

from lra.train import progress as progress_mod
from lra.train.steps import ROW

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class _Terminal(io.StringIO):
  def isatty(self):
    return True


class _Log:
  """metrics.jsonl's writer, kept in a list."""

  def __init__(self):
    self.rows = []

  def write(self, step, split, **values):
    self.rows.append(dict(step=step, split=split, **values))
    return self.rows[-1]


class _Clock:
  """time.perf_counter, moved by hand."""

  def __init__(self):
    self.now = 100.0

  def __call__(self):
    return self.now


def _row(loss=1.0):
  values = dict(
    loss=loss,
    grad_norm=1.0,
    correct_sum=3.0,
    count=10.0,
    params_finite=1.0,
    learning_rate=1e-3,
  )
  return np.array([values[k] for k in ROW], np.float32)


def _train(monkeypatch, stream, steps=100, log_every=10, step_s=0.1):
  """Drives a Progress as the loop does: the first step compiles, a log
  step every `log_every`, each step `step_s` seconds; returns it and the
  postfix (steps/s, ETA) the bar showed after each step."""
  clock = _Clock()
  monkeypatch.setattr(time, 'perf_counter', clock)
  config = ml_collections.ConfigDict({'num_train_steps': steps})
  p = progress_mod.Progress(
    config,
    _Log(),
    start=0,
    stages=None,
    acc_key='accuracy',
    primary=True,
    stream=stream,
  )
  shown = []
  for step in range(1, steps + 1):
    clock.now += step_s
    p.step_done(step, _row(), compiled=step == 1)
    if step % log_every == 0:
      p.log_step()
    shown.append(dict(p.shown))
  p.flush()
  p.close()
  return p, shown


def test_terminal_eta_follows_the_rate_between_log_steps(monkeypatch):
  p, shown = _train(monkeypatch, _Terminal(), log_every=50)
  assert p.terminal
  # 10 steps/s measured; the ETA counts down between the log steps 50
  # and 100 instead of holding the value of step 51.
  etas = [s.get('eta') for s in shown[51:99]]
  assert len(set(etas)) >= 5, etas
  assert shown[60]['eta'] == '00:04'  # after step 61: 39 steps at 10/s
  assert shown[90]['eta'] == '00:00' or shown[90]['eta'] == '00:01'
  assert float(shown[60]['steps_per_s']) == 10.0
  # Loss and accuracy: the last log step's (the device is not drained).
  assert shown[60]['loss'] == '1.0000'
  assert 'eta' not in shown[0]  # nothing timed yet: no rate invented


def test_rate_excludes_evaluation(monkeypatch):
  """A pause between flush and resume_timer (an evaluation) is not
  training: the rate stays that of the steps."""
  clock = _Clock()
  monkeypatch.setattr(time, 'perf_counter', clock)
  config = ml_collections.ConfigDict({'num_train_steps': 100})
  p = progress_mod.Progress(
    config,
    _Log(),
    start=0,
    stages=None,
    acc_key='accuracy',
    primary=True,
    stream=_Terminal(),
  )
  for step in range(1, 41):
    clock.now += 0.2
    p.step_done(step, _row(), compiled=step == 1)
    if step == 20:
      p.flush()
      clock.now += 60.0  # the evaluation
      p.resume_timer(step)
  assert abs(p.rate() - 5.0) < 1e-6
  p.close()


def test_plain_lines_when_not_a_terminal(monkeypatch):
  stream = io.StringIO()
  monkeypatch.setattr(progress_mod.Progress, 'LINE_EVERY_S', 2.0)
  p, _ = _train(monkeypatch, stream, steps=100, log_every=10, step_s=0.1)
  text = stream.getvalue()
  assert not p.terminal
  assert '\r' not in text and '\x1b' not in text
  lines = text.splitlines()
  steps = [int(re.match(r'train step (\d+)/100 ', ln).group(1)) for ln in lines]
  # The first after the first log step, then one per 2 s (20 steps), and
  # the last step at the end.
  assert steps[0] == 11 and steps[-1] == 100, steps
  assert all(b - a >= 20 for a, b in zip(steps[:-2], steps[1:-1])), steps
  assert 5 <= len(steps) <= 7, steps
  assert 'loss 1.0000' in lines[1] and 'steps/s 10.00' in lines[1]
  etas = [re.search(r'eta (\S+)', ln).group(1) for ln in lines[1:]]
  assert etas == sorted(etas, reverse=True) and etas[0] != etas[-1]


def test_train_written_to_a_pipe_has_no_cursor_codes(tmp_path):
  """train.py with its output captured, generating its data first: plain
  lines only."""
  proc = subprocess.run(
    [
      sys.executable,
      'train.py',
      '--config=configs/listops.py:transformer,smoke',
      f'--workdir={tmp_path / "run"}',
      f'--config.data_dir={tmp_path / "data"}',
    ],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert proc.returncode == 0, proc.stderr
  for text in (proc.stdout, proc.stderr):
    assert '\r' not in text and '\x1b[' not in text
  assert re.search(r'^train step \d+/\d+ \(\d+%\)', proc.stdout, re.M)
  assert 'Preparing the listops data in ' in proc.stderr
  assert 'Results: ' in proc.stdout
