"""python -m lra.sweep.archive: a sweep's results without checkpoints,
read by mqar_report as the sweep itself, merged across pieces."""

import json
import os
import shutil

import pytest

from experiments.mqar import report as mqar_report
from lra.errors import UserError
from lra.sweep import archive as sweep_archive


def write_sweep(out, runs, command):
  """A sweep as `python -m lra.sweep --out OUT` leaves it, run from the
  current folder (workdirs relative to it): runs are (lr, val, test)."""
  entries = []
  for lr, val, test in runs:
    name = f'mqar/transformer-small/learning_rate={lr}'
    workdir = os.path.join(out, name)
    os.makedirs(os.path.join(workdir, 'checkpoints', 'latest'))
    files = {
      'config.json': {
        'data': {'form': 'causal', 'seq_len': 64, 'num_kv_pairs': 8},
        'model': {'emb_dim': 64},
      },
      'results.json': {'test': {'accuracy': test}},
      'eval_test_best.json': {'accuracy': test},
    }
    for file, data in files.items():
      with open(os.path.join(workdir, file), 'w') as f:
        json.dump(data, f)
    with open(os.path.join(workdir, 'metrics.jsonl'), 'w') as f:
      for step, acc in ((250, val / 2), (500, val)):
        f.write(json.dumps({'step': step, 'split': 'val', 'accuracy': acc}))
        f.write('\n')
    for junk in ('train.log', 'checkpoints/latest/params'):
      with open(os.path.join(workdir, junk), 'w') as f:
        f.write('x' * 1000)
    entries.append(
      dict(
        name=name, task='mqar', model='transformer', preset='small',
        workdir=workdir, grid={'learning_rate': lr}, status='done',
        val_accuracy=val, val_loss=1 - val, test_accuracy=test,
      )
    )  # fmt: skip
  with open(os.path.join(out, 'sweep.json'), 'w') as f:
    json.dump({'command': command, 'runs': entries}, f)


def test_archive_keeps_what_reports_read_and_reads_as_the_sweep(
  tmp_path, monkeypatch
):
  monkeypatch.chdir(tmp_path)
  write_sweep('runs/a', [('1e-3', 0.5, 0.45), ('1e-2', 0.9, 0.88)], 'cmd a')
  from_sweep = mqar_report.rows_of(['runs/a'])
  assert sweep_archive.archive('runs/a', 'docs/a') == (2, 0)
  kept = sorted(
    os.path.relpath(os.path.join(d, f), 'docs/a')
    for d, _, files in os.walk('docs/a')
    for f in files
  )
  run = 'mqar/transformer-small/learning_rate=1e-2'
  assert f'{run}/metrics.jsonl' in kept and f'{run}/config.json' in kept
  assert f'{run}/eval_test_best.json' in kept
  assert not [k for k in kept if 'checkpoints' in k or k.endswith('.log')]
  # The sweep's folders gone, the archive read from elsewhere: the same rows.
  shutil.rmtree('runs')
  archive = str(tmp_path / 'docs' / 'a')
  monkeypatch.chdir('/')
  rows = mqar_report.rows_of([archive])
  assert len(rows) == 1 and rows[0]['choice'] == 'learning_rate=1e-2'
  drop = ('workdir',)
  assert [{k: v for k, v in r.items() if k not in drop} for r in rows] == [
    {k: v for k, v in r.items() if k not in drop} for r in from_sweep
  ]
  assert rows[0]['workdir'] == os.path.join(archive, run)


def test_archives_of_pieces_merge_and_the_newer_run_wins(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  write_sweep('runs/a', [('1e-3', 0.5, 0.45), ('1e-2', 0.9, 0.88)], 'cmd a')
  sweep_archive.archive('runs/a', 'docs/a')
  shutil.rmtree('runs')  # another machine: the first piece's runs are gone
  write_sweep('runs/a', [('1e-2', 0.95, 0.93), ('1e-4', 0.1, 0.1)], 'cmd b')
  assert sweep_archive.archive('runs/a', 'docs/a') == (2, 1)
  with open('docs/a/sweep.json') as f:
    data = json.load(f)
  assert data['commands'] == ['cmd a', 'cmd b']
  by_lr = {e['grid']['learning_rate']: e for e in data['runs']}
  assert sorted(by_lr) == ['1e-2', '1e-3', '1e-4']
  assert by_lr['1e-2']['val_accuracy'] == 0.95
  assert all(not os.path.isabs(e['workdir']) for e in data['runs'])
  (row,) = mqar_report.rows_of(['docs/a'])
  assert row['rates'] == ('1e-4', '1e-3', '1e-2') and row['curve'] == {8: 0.93}


def test_bad_folders_are_one_sentence(tmp_path):
  with pytest.raises(UserError, match='no sweep.json with runs'):
    sweep_archive.archive(str(tmp_path), str(tmp_path / 'out'))
  with pytest.raises(UserError, match='give another --out'):
    sweep_archive.archive(str(tmp_path), str(tmp_path))


def test_committed_archive_gives_the_committed_table():
  """experiments/mqar/128x16_c/mqar.md is what mqar_report makes of the archive
  committed beside it (its grid-edge line aside): the figure can be remade
  on a fresh checkout."""
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  archive = os.path.join(root, 'experiments', 'mqar', 'runs', '128x16_c')
  rows = mqar_report.rows_of([archive])
  assert len(rows) == 20
  with open(
    os.path.join(root, 'experiments', 'mqar', '128x16_c', 'mqar.md')
  ) as f:
    committed = f.read()
  table = mqar_report.width_markdown(rows)
  assert '| `deltanet` | - | 99.6 (0.0032) |' in table
  kept = [ln for ln in table.splitlines() if 'highest rate' not in ln]
  assert '\n'.join(kept).strip() in committed
