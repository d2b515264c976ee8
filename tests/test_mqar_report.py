"""python -m experiments.mqar.report: the tuned choice per (model, form, width),
the curve over pairs at the training length, the table and the plot."""

import json
import os
import subprocess
import sys

import pytest

from experiments.mqar import report as mqar_report
from lra.errors import UserError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def write_sweep(folder, width, runs):
  """A sweep.json of mqar runs with their config.json: runs are
  (model, lr, val, test, {split: accuracy}, form)."""
  entries = []
  for model, lr, val, test, splits, form in runs:
    workdir = os.path.join(folder, 'mqar', f'{model}-small', f'lr={lr}')
    os.makedirs(workdir)
    config = {
      'data': {'form': form, 'seq_len': 128, 'num_kv_pairs': 8},
      'model': {'emb_dim': width},
    }
    with open(os.path.join(workdir, 'config.json'), 'w') as f:
      json.dump(config, f)
    entries.append(
      dict(
        task='mqar',
        model=model,
        preset='small',
        workdir=workdir,
        grid={'learning_rate': lr},
        status='done',
        val_accuracy=val,
        val_loss=1.0 - val,
        test_accuracy=test,
        test_splits=splits,
      )
    )
  with open(os.path.join(folder, 'sweep.json'), 'w') as f:
    json.dump({'command': 'x', 'runs': entries}, f)


@pytest.fixture
def sweeps(tmp_path):
  splits = {'128:4': 1.0, '128:32': 0.5, '256:16': 0.25}
  w64, w32 = str(tmp_path / 'w64'), str(tmp_path / 'w32')
  write_sweep(
    w64,
    64,
    [
      ('transformer', '1e-3', 0.9, 0.91, splits, 'causal'),
      ('transformer', '3e-3', 0.99, 0.98, splits, 'causal'),
      ('local', '1e-3', 0.3, 0.31, {'128:4': 0.6}, 'causal'),
      ('linformer', '1e-3', 0.5, 0.4, {}, 'bidirectional'),
    ],
  )
  write_sweep(w32, 32, [('local', '1e-3', 0.2, 0.2, {}, 'causal')])
  return w64, w32


def test_rows_pick_the_best_on_validation_and_join_the_curve(sweeps):
  rows = mqar_report.rows_of(list(sweeps))
  by = {(r['model'], r['width']): r for r in rows}
  t = by['transformer', 64]
  assert t['choice'] == 'learning_rate=3e-3'
  assert t['curve'] == {4: 1.0, 8: 0.98, 32: 0.5}  # 256:16 is not L=128
  assert t['splits']['256:16'] == 0.25
  assert by['local', 32]['curve'] == {8: 0.2}
  text = mqar_report.markdown(rows)
  line = [ln for ln in text.splitlines() if ln.startswith('| `transformer`')]
  assert line == [
    '| `transformer` | causal | 64 | learning_rate=3e-3 | 2 | 100.0 | 98.0 | '
    '50.0 | 25.0 |'
  ]
  assert '| `linformer` | bi | 64 |' in text


def test_command_writes_table_and_plot(sweeps, tmp_path):
  out = str(tmp_path / 'out')
  proc = subprocess.run(
    [
      sys.executable,
      '-m',
      'experiments.mqar.report',
      f'--sweeps={",".join(sweeps)}',
      f'--out={out}',
    ],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert proc.returncode == 0, proc.stderr
  assert os.path.getsize(os.path.join(out, 'mqar.png')) > 10_000
  with open(os.path.join(out, 'mqar.md')) as f:
    text = f.read()
  # The per-pairs table: a header, a rule and 4 rows, after the width table.
  assert text.count('| `transformer` |') == 2
  assert len([ln for ln in text.splitlines() if ln.startswith('| `')]) == 3 + 4


def test_same_comparison_twice_and_no_sweep_are_one_sentence(sweeps, tmp_path):
  with pytest.raises(UserError, match='is in both'):
    mqar_report.rows_of([sweeps[1], sweeps[1]])
  with pytest.raises(UserError, match='no sweep.json in it'):
    mqar_report.rows_of([str(tmp_path)])


def test_width_axis_tunes_each_width_and_plots(tmp_path):
  """A grid over model.emb_dim x learning_rate: each width tuned on its own
  (Zoology's best learning rate per point), one table per setting, the
  width plot and the curves plot written."""
  folder = str(tmp_path / 'sw')
  entries = []
  for width, lr, val, test in [
    (32, '1e-3', 0.5, 0.45),
    (32, '1e-2', 0.6, 0.55),
    (64, '1e-3', 0.95, 0.93),
    (64, '1e-2', 0.2, 0.2),
    (128, '1e-3', 0.97, 0.96),  # a sweep run in pieces: one rate so far
    (256, '1e-3', 0.97, 0.97),
    (256, '1e-2', None, None),  # diverged: tried, so the point is complete
  ]:
    workdir = os.path.join(folder, f'w{width}-{lr}')
    os.makedirs(workdir)
    config = {
      'learning_rate': float(lr),
      'data': {'form': 'causal', 'seq_len': 64, 'num_kv_pairs': 8},
      'model': {'emb_dim': width},
    }
    with open(os.path.join(workdir, 'config.json'), 'w') as f:
      json.dump(config, f)
    with open(os.path.join(workdir, 'metrics.jsonl'), 'w') as f:
      # width 32 still rising at its end (30 -> 60%), width 64 flat
      for step, acc in ((100, val / 2 if width == 32 else val), (200, val)):
        f.write(json.dumps({'step': step, 'split': 'val', 'accuracy': acc}))
        f.write('\n')
    entries.append(
      dict(
        task='mqar', model='mamba', preset='small', workdir=workdir,
        grid={'model.emb_dim': str(width), 'learning_rate': lr},
        status='done', val_accuracy=val, val_loss=1 - val,
        test_accuracy=test, test_splits={},
      ) if val is not None else dict(
        task='mqar', model='mamba', preset='small', workdir=workdir,
        grid={'model.emb_dim': str(width), 'learning_rate': lr},
        status='failed', message='error: Training stopped: the gradient '
        'norm is not finite at step 74; no checkpoint had been saved yet',
      )
    )  # fmt: skip
  with open(os.path.join(folder, 'sweep.json'), 'w') as f:
    json.dump({'command': 'x', 'runs': entries}, f)
  rows = mqar_report.rows_of([folder])
  by = {r['width']: r for r in rows}
  assert by[32]['choice'] == 'learning_rate=1e-2'
  assert by[64]['choice'] == 'learning_rate=1e-3'
  # every run finished, but width 128 has 1 of the 2 rates the others had
  assert [by[w]['complete'] for w in (32, 64, 128, 256)] == [
    True, True, False, True
  ]  # fmt: skip
  table = mqar_report.width_markdown(rows)
  assert '(learning rate chosen on validation among 1e-3, 1e-2).' in table
  # 32 chose 1e-2; 64, 256 chose 1e-3; 128 has one rate (not counted)
  assert (
    '1 of 3 points chose the highest rate of their grid and 2 of 3 points '
    'chose the lowest rate of their grid: a better rate may lie beyond the '
    'grid there.' in table
  )
  assert (
    '| `mamba` | 55.0 (0.01)^ | 93.0 (0.001) | 96.0 (0.001)* | 97.0 (0.001)~ |'
    in table
  )
  assert '`~` a rate of the grid diverged' in table
  assert '`^` validation still rising at the last evaluation' in table
  paths = mqar_report.report([folder], str(tmp_path / 'out'))
  for path in paths:
    assert os.path.getsize(path) > 0, path


def test_a_named_sweep_is_its_own_row_and_a_stopped_run_its_own_curve(
  tmp_path, sweeps
):
  """LABEL=FOLDER names a sweep's rows (one model in two set-ups is two
  rows, not a duplicate error); an interrupted run with validation points
  is listed under "Stopped before the end" with its best validation, and
  is not a table row."""
  w64, _ = sweeps
  other = str(tmp_path / 'other')
  write_sweep(other, 64, [('transformer', '1e-3', 0.5, 0.5, {}, 'causal')])
  with pytest.raises(UserError, match='LABEL=FOLDER'):
    mqar_report.rows_of([w64, other])
  rows = mqar_report.rows_of([w64, 'transformer (no FFN)=' + other])
  names = {(r['name'], r['width']) for r in rows}
  assert ('transformer', 64) in names
  assert ('transformer (no FFN)', 64) in names
  # An interrupted run: a curve, no row.
  stopped = str(tmp_path / 'stopped')
  workdir = os.path.join(stopped, 'run')
  os.makedirs(workdir)
  with open(os.path.join(workdir, 'config.json'), 'w') as f:
    json.dump(
      {'data': {'seq_len': 128, 'num_kv_pairs': 8}, 'model': {'emb_dim': 64}}, f
    )
  with open(os.path.join(workdir, 'metrics.jsonl'), 'w') as f:
    for step, acc in ((500, 0.1), (1000, 0.97), (1500, 0.95)):
      f.write(
        json.dumps({'step': step, 'split': 'val', 'accuracy': acc}) + '\n'
      )
  entry = dict(
    task='mqar', model='mamba', workdir=workdir, grid={'learning_rate': '1e-3'},
    status='interrupted', steps_done=1600, num_train_steps=4000,
  )  # fmt: skip
  with open(os.path.join(stopped, 'sweep.json'), 'w') as f:
    json.dump({'command': 'x', 'runs': [entry]}, f)
  with pytest.raises(UserError, match='no finished mqar run'):
    mqar_report.rows_of(['zoo=' + stopped])
  alone = mqar_report.report(['zoo=' + stopped], str(tmp_path / 'alone'))
  assert [os.path.basename(p) for p in alone] == ['mqar.md', 'mqar_curves.png']
  assert 'Stopped before the end' in open(alone[0]).read()
  found = mqar_report.stopped_of(['zoo=' + stopped])
  assert [(r['name'], r['best_val'], r['best_step']) for r in found] == [
    ('zoo', 97.0, 1000)
  ]
  paths = mqar_report.report([w64, 'zoo=' + stopped], str(tmp_path / 'o'))
  text = open(paths[0]).read()
  assert (
    '| `zoo` | 64 | 128:8 | learning_rate=1e-3 | 1,600 of 4,000 | '
    '97.0 (step 1,000) | - |' in text
  )
  assert os.path.getsize(paths[3]) > 0
  # eval.py's test of the best checkpoint, once run, joins the row
  with open(os.path.join(workdir, 'eval_test_best.json'), 'w') as f:
    json.dump({'accuracy': 0.9612, 'checkpoint': 'best', 'step': 1000}, f)
  text = open(mqar_report.report(['zoo=' + stopped], str(tmp_path / 'e'))[0])
  assert '97.0 (step 1,000) | 96.1 |' in text.read()


def test_seeds_in_the_width_table(tmp_path):
  """--grid seed=0,1 beside the learning rate: the cell is the mean test
  accuracy of the chosen rate's seeds, their range in brackets."""
  folder = str(tmp_path / 'sw')
  entries = []
  for lr, seed, val, test in [
    ('1e-3', '0', 0.9, 0.9), ('1e-3', '1', 0.9, 0.8),
    ('1e-2', '0', 0.2, 0.2), ('1e-2', '1', 0.2, 0.2),
  ]:  # fmt: skip
    workdir = os.path.join(folder, f'{lr}-{seed}')
    os.makedirs(workdir)
    config = {
      'learning_rate': float(lr),
      'data': {'form': 'causal', 'seq_len': 64, 'num_kv_pairs': 8},
      'model': {'emb_dim': 64},
    }
    with open(os.path.join(workdir, 'config.json'), 'w') as f:
      json.dump(config, f)
    entries.append(
      dict(
        task='mqar', model='gla', preset='small', workdir=workdir,
        grid={'learning_rate': lr, 'seed': seed}, status='done',
        val_accuracy=val, val_loss=1 - val, test_accuracy=test,
        test_splits={},
      )
    )  # fmt: skip
  with open(os.path.join(folder, 'sweep.json'), 'w') as f:
    json.dump({'command': 'x', 'runs': entries}, f)
  rows = mqar_report.rows_of([folder])
  assert [(r['choice'], r['seeds']) for r in rows] == [
    ('learning_rate=1e-3', 2)
  ]
  assert (
    '| `gla` | 85.0 (0.001) [80.0-90.0, 2 seeds] |'
    in mqar_report.width_markdown(rows)
  )


def test_a_grid_setting_of_one_sweep_is_its_own_row(tmp_path):
  """LABEL=FOLDER@KEY=VALUE keeps the runs of one grid setting: an option
  compared (not tuned) gives one row per value; a setting no run has is
  one sentence."""
  w64 = str(tmp_path / 'w64')
  write_sweep(
    w64,
    64,
    [
      ('transformer', '1e-3', 0.9, 0.91, {}, 'causal'),
      ('transformer', '3e-3', 0.99, 0.98, {}, 'causal'),
    ],
  )
  rows = mqar_report.rows_of(
    [
      'tf 1e-3=' + w64 + '@learning_rate=1e-3',
      'tf 3e-3=' + w64 + '@learning_rate=3e-3',
    ]
  )
  got = {(r['name'], r['model']) for r in rows}
  assert ('tf 1e-3', 'transformer') in got and ('tf 3e-3', 'transformer') in got
  # Each row holds its own setting's run, not the best of both.
  by_name = {r['name']: r for r in rows if r['model'] == 'transformer'}
  assert by_name['tf 1e-3']['choice'] == 'learning_rate=1e-3'
  assert by_name['tf 3e-3']['choice'] == 'learning_rate=3e-3'
  assert by_name['tf 1e-3']['curve'] == {8: 0.91}
  with pytest.raises(UserError, match='no run of .* has the grid setting'):
    mqar_report.rows_of([w64 + '@learning_rate=5'])
  with pytest.raises(UserError, match='after @ comes KEY=VALUE'):
    mqar_report.rows_of([w64 + '@oops'])


def test_many_models_are_drawn_in_two_families():
  """More models than the palette tells apart: the attention cores and the
  mixers get a row of panels each (their `core`, as config.json names it;
  a core this checkout lacks goes with the attention cores)."""
  cores = ['softmax', 'linear', 'performer', 'reformer', 'bigbird', 'local']
  mixers = ['mamba', 's4d', 's5', 'hyena']
  rows = [
    {'model': f'm_{c}', 'name': f'm_{c}', 'core': c, 'form': 'causal'}
    for c in [*cores, *mixers, 'no_such_core']
  ]
  names = [r['name'] for r in rows]
  families = dict(mqar_report._families(rows, names))
  assert families['sequence mixers'] == [f'm_{c}' for c in mixers]
  assert families['attention cores'] == [
    f'm_{c}' for c in [*cores, 'no_such_core']
  ]
  assert mqar_report._families(rows[:8], names[:8]) == [('', names[:8])]


def test_still_rising_is_a_last_point_above_every_earlier_one():
  assert mqar_report.still_rising([(100, 10.0), (200, 30.0)])
  assert not mqar_report.still_rising([(100, 10.0), (200, 10.5)])
  # a late dip back to the plateau is not rising
  assert not mqar_report.still_rising([(100, 40.0), (200, 20.0), (300, 40.5)])
  assert not mqar_report.still_rising([(100, 10.0)])
