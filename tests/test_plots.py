"""Watching runs: `eval.py --plot` curves and TensorBoard scalars of the
shared smoke run (tests/conftest.py), and the note when no writer is there."""

import json
import math
import os
import shutil
import subprocess
import sys

import ml_collections
import pytest

from lra.data.tfrecord import read_records
from lra.report import curves
from lra.train import metrics, steps
from lra.train.metrics import MetricsLog, read_rows

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _two_runs(smoke_run, tmp_path):
  """runs/a (the smoke run's metrics) and runs/b (its losses doubled)."""
  rows = read_rows(os.path.join(smoke_run, 'metrics.jsonl'))
  for name, scale in (('a', 1.0), ('b', 2.0)):
    os.makedirs(tmp_path / 'runs' / name)
    with open(tmp_path / 'runs' / name / 'metrics.jsonl', 'w') as f:
      for r in rows:
        r = dict(r, loss=r['loss'] * scale) if 'loss' in r else r
        f.write(json.dumps(r) + '\n')
  return str(tmp_path / 'runs'), rows


def test_plot_draws_one_line_per_run(smoke_run, tmp_path):
  runs, rows = _two_runs(smoke_run, tmp_path)
  written, data = curves.plot([runs])
  assert [os.path.basename(p) for p in written] == [
    'curves_loss.png',
    'curves_accuracy.png',
  ]
  for path in written:
    with open(path, 'rb') as f:
      assert f.read(8) == b'\x89PNG\r\n\x1a\n'
  for split in ('train', 'val'):
    want = [(r['step'], r['loss']) for r in rows if r['split'] == split]
    lines = data['loss', split]
    assert sorted(lines) == ['a', 'b']
    assert list(zip(*lines['a'])) == want
    assert lines['b'][1] == [2 * v for _, v in want]
  # The command: many run folders, the PNGs where --plot_dir says.
  out = tmp_path / 'plots'
  a, b = os.path.join(runs, 'a'), os.path.join(runs, 'b')
  proc = subprocess.run(
    [sys.executable, 'eval.py', f'--plot={a},{b}', f'--plot_dir={out}'],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert proc.returncode == 0, proc.stderr
  assert sorted(os.listdir(out)) == ['curves_accuracy.png', 'curves_loss.png']
  with pytest.raises(metrics.UserError, match='no metrics.jsonl'):
    curves.plot([str(tmp_path / 'plots')])


def test_plot_lm_runs_draws_token_accuracy_and_perplexity(tmp_path):
  """Runs of an LM objective: token accuracy, and a causal_lm run's
  perplexity (train: exp of the logged loss); no empty accuracy PNG."""
  logs = {
    'clm': ('causal_lm', [2.0, 1.5], {'perplexity': 5.0}),
    'mlm': ('masked_lm', [3.0, 2.5], {}),
  }
  for name, (objective, losses, extra) in logs.items():
    run = tmp_path / 'runs' / name
    run.mkdir(parents=True)
    (run / 'config.json').write_text(json.dumps({'objective': objective}))
    rows = [
      {'step': s, 'split': 'train', 'loss': v, 'token_accuracy': 0.1 * s}
      for s, v in zip((1, 2), losses)
    ]
    rows.append(
      {'step': 2, 'split': 'val', 'loss': 1.6, 'token_accuracy': 0.3, **extra}
    )
    (run / 'metrics.jsonl').write_text(
      ''.join(json.dumps(r) + '\n' for r in rows)
    )
  written, data = curves.plot([str(tmp_path / 'runs')], str(tmp_path / 'p'))
  assert [os.path.basename(p) for p in written] == [
    'curves_loss.png',
    'curves_token_accuracy.png',
    'curves_perplexity.png',
  ]
  assert data['token_accuracy', 'train']['mlm'] == ([1, 2], [0.1, 0.2])
  steps, values = data['perplexity', 'train']['clm']
  assert steps == [1, 2] and values == pytest.approx(
    [math.exp(2), math.exp(1.5)]
  )
  assert data['perplexity', 'val'] == {'clm': ([2], [5.0])}
  assert 'mlm' not in data['perplexity', 'train']


def test_train_rows_carry_the_learning_rate(smoke_run):
  rows = [
    r
    for r in read_rows(os.path.join(smoke_run, 'metrics.jsonl'))
    if r['split'] == 'train'
  ]
  with open(os.path.join(smoke_run, 'config.json')) as f:
    config = ml_collections.ConfigDict(json.load(f))
  schedule = steps.learning_rate_schedule(config)
  rates = [r['learning_rate'] for r in rows]
  # Computed in the step (lra.train.steps.ROW), where XLA may rewrite the
  # schedule's arithmetic (a / sqrt(b) as a * rsqrt(b)): float32's last bit.
  expected = [float(schedule(r['step'] - 1)) for r in rows]
  assert rates == pytest.approx(expected, rel=3e-7)
  assert len(set(rates)) > 1


def _scalars(folder):
  """{tag: {step: value}} from the event files in folder."""
  from tensorboardX.proto import event_pb2

  out = {}
  for name in os.listdir(folder):
    for record in read_records(os.path.join(folder, name)):
      event = event_pb2.Event.FromString(record)
      for v in event.summary.value:
        out.setdefault(v.tag, {})[event.step] = v.simple_value
  return out


def test_tensorboard_scalars_beside_metrics(smoke_run):
  pytest.importorskip('tensorboardX')
  got = _scalars(os.path.join(smoke_run, 'tensorboard'))
  rows = read_rows(os.path.join(smoke_run, 'metrics.jsonl'))
  for split, tags in (
    ('train', ('loss', 'accuracy', 'learning_rate', 'grad_norm')),
    ('val', ('loss', 'accuracy')),
  ):
    for tag in tags:
      want = {r['step']: r[tag] for r in rows if r['split'] == split}
      assert got[f'{split}/{tag}'] == pytest.approx(want, rel=1e-6), tag
  assert 'train/steps_per_sec' in got
  best = [r for r in rows if r.get('checkpoint') == 'best'][0]
  assert got['test_best/accuracy'] == pytest.approx(
    {best['step']: best['accuracy']}
  )


def test_without_a_writer_training_logs_and_says_so_once(
  tmp_path, monkeypatch, capsys
):
  monkeypatch.setitem(sys.modules, 'tensorboardX', None)
  monkeypatch.setattr(metrics.TensorBoard, 'hinted', False)
  for name in ('a', 'b'):
    os.makedirs(tmp_path / name)
    log = MetricsLog(str(tmp_path / name))
    log.write(1, 'train', loss=1.0)
    log.close()
    assert read_rows(str(tmp_path / name / 'metrics.jsonl'))[0]['loss'] == 1.0
    assert not os.path.exists(tmp_path / name / 'tensorboard')
  out = capsys.readouterr().out
  assert out.count('pip install tensorboardX') == 1


def test_resumed_log_purges_later_events(tmp_path):
  pytest.importorskip('tensorboardX')
  workdir = str(tmp_path)
  log = MetricsLog(workdir)
  for step in (1, 2, 3):
    log.write(step, 'train', loss=float(step))
  log.close()
  log = MetricsLog(workdir, resume_step=2)  # steps past 2 are redone
  log.write(3, 'train', loss=30.0)
  log.close()
  assert [r['loss'] for r in read_rows(log.path)] == [1.0, 2.0, 30.0]
  # Both files hold step 3; the second starts with a purge of steps >= 3,
  # which TensorBoard applies (the raw events keep both).
  from tensorboardX.proto import event_pb2

  board = os.path.join(workdir, 'tensorboard')
  purged = []
  for name in sorted(os.listdir(board)):
    for record in read_records(os.path.join(board, name)):
      event = event_pb2.Event.FromString(record)
      if event.HasField('session_log'):
        purged.append(event.step)
  assert purged == [3]
  shutil.rmtree(board)
