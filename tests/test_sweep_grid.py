"""python -m lra.sweep --grid: the cross product, one workdir per
combination, the tuned table's choice on validation, skip on rerun."""

import functools
import json
import os
import subprocess
import sys

import pytest

from lra.errors import UserError
from lra.sweep import grid as sweep_grid
from lra.sweep import main as sweep
from lra.sweep import plan as sweep_plan

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
plan = functools.partial(sweep_plan.plan, catalogue=sweep.catalogue())
GRID = (
  '--grid=learning_rate=1e-3,3e-2',
  '--grid=model.attention.block_size=8,50',
)


def run_sweep(*args):
  return subprocess.run(
    [sys.executable, '-m', 'lra.sweep.main', *args],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=1200,
  )


def test_parse_and_cross_product_in_order():
  grid = sweep_grid.parse(['learning_rate=1e-3,3e-3', 'config.model.x=a,b,c'])
  assert grid == (
    ('learning_rate', ('1e-3', '3e-3')),
    ('model.x', ('a', 'b', 'c')),
  )
  combos = sweep_grid.combinations(grid)
  assert len(combos) == 6
  assert combos[0] == (('learning_rate', '1e-3'), ('model.x', 'a'))
  assert combos[1] == (('learning_rate', '1e-3'), ('model.x', 'b'))
  assert combos[-1] == (('learning_rate', '3e-3'), ('model.x', 'c'))
  assert sweep_grid.combinations(()) == [()]
  runs = plan('mqar', 'local,transformer', 'smoke', 'o', grid=grid)
  assert len(runs) == 12
  assert runs[0].name == 'mqar/local-smoke/learning_rate=1e-3,model.x=a'
  assert runs[0].argv()[-2:] == [
    '--config.learning_rate=1e-3',
    '--config.model.x=a',
  ]


@pytest.mark.parametrize(
  'specs, overrides, words',
  [
    (['learning_rate'], (), 'is not key=value,value'),
    (['learning_rate=1e-3,'], (), 'is not key=value,value'),
    (['lr=1,2', 'lr=3'], (), 'names lr twice'),
    (['lr=1,1'], (), 'lists a value twice'),
    (['learning_rate=1,2'], ('--config.learning_rate=3',), 'set by both'),
  ],
)
def test_bad_grid_is_one_sentence(specs, overrides, words):
  with pytest.raises(UserError, match=words):
    sweep_grid.parse(specs, overrides)


def test_tuned_choice_ties_and_partial():
  def entry(lr, acc, loss, status='done'):
    return dict(
      task='mqar',
      model='local',
      preset='small',
      grid={'learning_rate': lr},
      status=status,
      val_accuracy=acc,
      val_loss=loss,
      test_accuracy=acc,
      test_splits=None if acc is None else {'256:16': acc / 2},
    )

  runs = [
    entry('1e-3', 0.5, 1.0),
    entry('3e-3', 0.9, 0.4),
    entry('1e-2', 0.9, 0.3),  # ties on accuracy, lower loss: chosen
    entry('3e-2', None, None, status='failed'),
  ]
  (row,) = sweep_grid.tuned_rows(runs)
  assert row['best']['grid'] == {'learning_rate': '1e-2'}
  assert not row['complete']
  text = sweep_grid.tuned_markdown(runs)
  line = text.splitlines()[2]
  assert '| learning_rate=1e-2 (partial) | 90.00% | 90.00% | 45.00% |' in line
  assert 'learning_rate=3e-2: failed' in line
  assert text.splitlines()[0].count('test 256:16') == 1
  # A rate stopped by train.py's non-finite check was tried: it diverged.
  runs[-1]['message'] = (
    'error: Training stopped: the parameters diverged (their norm '
    'overflows) at step 12; no checkpoint had been saved yet; ...'
  )
  (row,) = sweep_grid.tuned_rows(runs)
  assert (row['complete'], row['diverged']) == (True, 1)
  line = sweep_grid.tuned_markdown(runs).splitlines()[2]
  assert '| learning_rate=1e-2 | 90.00% |' in line
  assert 'learning_rate=3e-2: diverged' in line


def test_bad_grid_value_and_spt_are_refused(tmp_path):
  proc = run_sweep(
    '--tasks=listops',
    '--models=local',
    '--preset=smoke',
    f'--out={tmp_path}',
    '--grid=model.attention.no_such=1,2',
  )
  assert proc.returncode == 2
  assert proc.stderr.startswith('error: --grid model.attention.no_such=1')
  assert 'Traceback' not in proc.stderr
  with pytest.raises(UserError, match='does not combine with'):
    plan('listops', 'local', 'smoke_spt', 'o', grid=(('lr', ('1', '2')),))


@pytest.mark.slow
def test_two_by_two_grid_runs_picks_and_skips(tmp_path, smoke_data_dir):
  out = str(tmp_path / 'grid')
  common = (
    '--tasks=listops',
    '--models=local',
    '--preset=smoke',
    f'--out={out}',
    f'--config.data_dir={smoke_data_dir}',
    *GRID,
  )
  dry = run_sweep(*common, '--dry_run')
  assert dry.returncode == 0, dry.stderr
  assert dry.stdout.startswith('4 runs planned (4 grid combinations each).')
  first = run_sweep(*common)
  assert first.returncode == 0, first.stderr[-2000:]
  names = sorted(os.listdir(os.path.join(out, 'listops', 'local-smoke')))
  assert names == [
    'learning_rate=1e-3,model.attention.block_size=50',
    'learning_rate=1e-3,model.attention.block_size=8',
    'learning_rate=3e-2,model.attention.block_size=50',
    'learning_rate=3e-2,model.attention.block_size=8',
  ]
  with open(os.path.join(out, 'sweep.json')) as f:
    runs = json.load(f)['runs']
  assert [r['status'] for r in runs] == ['done'] * 4
  for r in runs:  # each run trained with its own values
    with open(os.path.join(r['workdir'], 'config.json')) as f:
      config = json.load(f)
    assert (
      f'{config["learning_rate"]:g}' == f'{float(r["grid"]["learning_rate"]):g}'
    )
    assert (
      str(config['model']['attention']['block_size'])
      == (r['grid']['model.attention.block_size'])
    )
  best = min(runs, key=lambda r: (-r['val_accuracy'], r['val_loss']))
  with open(os.path.join(out, 'tuned.md')) as f:
    tuned = f.read().splitlines()
  assert len(tuned) == 3
  assert f'| {sweep_grid.label(tuple(best["grid"].items()))} |' in tuned[2]
  again = run_sweep(*common)
  assert again.returncode == 0, again.stderr[-2000:]
  assert again.stdout.count('skipped, already finished') == 4
  assert 'running' not in again.stdout


def test_seeds_choose_by_the_mean_and_report_their_range():
  """--grid seed=0,1: lr 1e-3 has the single best seed (0.9) but the lower
  mean (0.7); lr 3e-3 (0.8, 0.8) is chosen, its accuracies the means, the
  seeds' range beside them; an unfinished seed is left out of the mean."""

  def entry(lr, seed, val, test, status='done'):
    return dict(
      task='mqar', model='m', preset='small', status=status,
      grid={'learning_rate': lr, 'seed': seed}, val_accuracy=val,
      val_loss=1 - val, test_accuracy=test, test_splits={'64:4': test},
      workdir=f'w/{lr}/{seed}',
    )  # fmt: skip

  runs = [
    entry('1e-3', '0', 0.9, 0.88),
    entry('1e-3', '1', 0.5, 0.52),
    entry('3e-3', '0', 0.8, 0.79),
    entry('3e-3', '1', 0.8, 0.81),
    entry('3e-3', '2', 0.1, 0.1, status='interrupted'),
  ]
  best = sweep_grid.best_of(runs)
  assert best['grid'] == {'learning_rate': '3e-3'}
  assert best['seed_count'] == 2
  assert best['val_accuracy'] == pytest.approx(0.8)
  assert best['test_accuracy'] == pytest.approx(0.80)
  assert best['test_range'] == (0.79, 0.81)
  assert best['test_splits'] == {'64:4': pytest.approx(0.80)}
  assert [r['workdir'] for r in best['seed_runs']] == ['w/3e-3/0', 'w/3e-3/1']
  table = sweep_grid.tuned_markdown(runs)
  assert '80.00% (79.00-81.00%, 2 seeds)' in table
  # Without a seed key the single best run is chosen, as before.
  plain = [
    dict(
      r, grid={'learning_rate': r['grid']['learning_rate'] + r['grid']['seed']}
    )
    for r in runs[:4]
  ]
  assert sweep_grid.best_of(plain)['val_accuracy'] == 0.9


# run_config: ml_collections loads a config file by load_module (deprecated).
@pytest.mark.filterwarnings('ignore:the load_module:DeprecationWarning')
def test_a_diverged_run_is_skipped_while_its_config_is_unchanged(
  tmp_path, monkeypatch, capsys
):
  """A rerun of the sweep does not train a run that diverged again (the
  same seed diverges again), and --dry_run says so; --retry_diverged, or a
  changed config, trains it."""
  from lra.errors import NON_FINITE_STOP
  from lra.sweep import estimate as sweep_estimate
  from lra.sweep import runner as sweep_run
  from lra.train import rundir

  out = str(tmp_path)
  (run,) = plan(
    'listops',
    'local',
    'smoke',
    out,
    catalogue=sweep.catalogue(),
    grid=(('learning_rate', ('1',)),),
  )
  config, _ = sweep_plan.run_config(run)
  rundir.write_config(config, run.workdir)
  message = f'{NON_FINITE_STOP}the loss at step 3; no checkpoint ...'
  before = {
    'name': run.name,
    'status': 'failed',
    'exit_status': 1,
    'message': message,
    'wall_seconds': 5.0,
  }
  with open(os.path.join(out, 'sweep.json'), 'w') as f:
    json.dump({'command': 'x', 'runs': [before]}, f)
  trained = []

  def fake_train(self, r):
    trained.append(r.name)
    return 1, 1.0, message

  monkeypatch.setattr(sweep_run.Sweep, '_train', fake_train)
  entry = sweep_run.Sweep([run], out)._one(run, 1, 1)
  assert trained == []
  assert entry['status'] == 'failed' and entry['message'] == message
  assert sweep_grid.diverged(entry)
  # The dry run shows the same skip, and counts the run as skipped.
  capsys.readouterr()
  sweep_estimate.dry_run([run], None, probe=False, out=out)
  shown = capsys.readouterr().out
  assert 'diverged in an earlier sweep, would be skipped' in shown
  assert '(1 skipped)' in shown
  sweep_estimate.dry_run([run], None, probe=False, out=out, retry_diverged=True)
  assert 'would be skipped' not in capsys.readouterr().out
  # --retry_diverged trains it.
  sweep_run.Sweep([run], out, retry_diverged=True)._one(run, 1, 1)
  assert trained == [run.name]
  # So does a changed config (the saved one differs).
  config.unlock()
  config.seed += 1
  rundir.write_config(config, run.workdir)
  sweep_run.Sweep([run], out)._one(run, 1, 1)
  assert trained == [run.name, run.name]
