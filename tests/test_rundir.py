"""lra/train/rundir.py: the run directory's files, the one rule for the selected
test accuracy (shared by the table and the sweep), the resume_changes key,
and the table's labels by a run's attention options."""

import json
import os

import pytest

from configs import listops, text
from lra.errors import UserError
from lra.report import tables as report
from lra.sweep import plan as sweep_plan
from lra.sweep import runner as sweep_run
from lra.train import rundir


def text_config(val='test'):
  """Text smoke; data.val='test' makes the automatic selection 'last'."""
  config = text.get_config('transformer,smoke')
  config.data.val = val
  return config


def results_of(task='text', model='transformer', **extra):
  """A classification results.json with distinct best and last tests."""
  return {
    'task': task,
    'model': model,
    'preset': 'smoke',
    'objective': 'classify',
    'best_step': 3,
    'val': {'accuracy': 0.5, 'loss': 1.0},
    'test': {'accuracy': 0.25, 'loss': 2.0},
    'last_step': 6,
    'test_last': {'accuracy': 0.75, 'loss': 0.5},
    'data_source': 'release',
    **extra,
  }


def make_run(workdir, config, results, saved_steps=(6,)):
  rundir.write_config(config, str(workdir))
  rundir.write_results(str(workdir), results)
  for step in saved_steps:
    os.makedirs(os.path.join(workdir, 'checkpoints', 'latest', str(step)))


# ------------------------------------------------------------ files
def test_results_and_config_round_trip(tmp_path):
  assert rundir.read_results(str(tmp_path)) is None
  assert rundir.read_config(str(tmp_path)) is None
  results = results_of(select='last')
  path = rundir.write_results(str(tmp_path), results)
  assert path == os.path.join(tmp_path, 'results.json')
  assert rundir.read_results(str(tmp_path)) == results
  config = text_config()
  rundir.write_config(config, str(tmp_path / 'new'))  # creates the workdir
  saved = rundir.read_config(str(tmp_path / 'new'))
  assert saved == json.loads(config.to_json())
  assert rundir.CHANGES_KEY not in saved
  # Unreadable files read as missing, not as a crash.
  (tmp_path / 'results.json').write_text('{"task": ')
  assert rundir.read_results(str(tmp_path)) is None
  (tmp_path / 'config.json').write_text('[1, 2]')  # JSON, not an object
  assert rundir.read_config(str(tmp_path)) is None


def test_saved_and_latest_step_from_folder_names(tmp_path):
  assert rundir.latest_step(str(tmp_path)) == 0
  for which, step in (('latest', 4), ('latest', 10), ('best', 7)):
    os.makedirs(tmp_path / 'checkpoints' / which / str(step))
  os.makedirs(tmp_path / 'checkpoints' / 'latest' / 'tmp_12')
  assert rundir.saved_steps(str(tmp_path)) == {
    'latest': [4, 10],
    'best': [7],
  }
  assert rundir.latest_step(str(tmp_path)) == 10


# -------------------------------------------------------- selection
def test_select_in_results_wins():
  config = json.loads(text_config().to_json())  # automatic: 'last'
  results = results_of(select='best_val')
  assert rundir.selection_of(results, config) == 'best_val'
  assert rundir.selected_test(results, config)['accuracy'] == 0.25
  results = results_of(select='last')
  assert rundir.selection_of(results) == 'last'
  assert rundir.selected_test(results)['accuracy'] == 0.75


def test_select_default_is_the_configs_selection():
  """Without `select`, what train.py would write (lra/train/metrics.py
  selection of config.json): 'last' when validation is the test set."""
  results = results_of()
  validate_on_test = json.loads(text_config('test').to_json())
  heldout = json.loads(text_config('heldout').to_json())
  assert rundir.selection_of(results, validate_on_test) == 'last'
  assert rundir.selected_test(results, validate_on_test)['accuracy'] == 0.75
  assert rundir.selection_of(results, heldout) == 'best_val'
  assert rundir.selection_of(results, None) == 'best_val'  # no config.json
  # Made before test_last existed: only `test` can be reported.
  old = {k: v for k, v in results.items() if k != 'test_last'}
  assert rundir.selection_of(old, validate_on_test) == 'best_val'
  assert rundir.selected_test(old, validate_on_test)['accuracy'] == 0.25
  # An LM objective (pretraining) has no selection.
  lm = results_of(objective='masked_lm')
  assert rundir.selection_of(lm, heldout) is None
  assert rundir.selected_test(lm, heldout) is None


def test_table_and_sweep_agree_on_the_default(tmp_path):
  """The rule the two used to disagree on: results.json without `select`
  of a run that validated on the test set reports its final step."""
  workdir = tmp_path / 'text' / 'transformer-smoke'
  make_run(workdir, text_config('test'), results_of())
  (run,) = report.read_runs(str(tmp_path))
  entry = sweep_run.outcome(str(workdir))
  assert run['select'] == entry['selection'] == 'last'
  assert run['accuracy'] == pytest.approx(100 * entry['test_accuracy'])
  assert entry['test_accuracy'] == 0.75
  assert entry['steps_done'] == 6


# ---------------------------------------------------------- changes
def test_changes_key_is_recorded_appended_and_ignored(tmp_path):
  assert rundir.CHANGES_KEY == 'resume_changes'  # older runs have it
  run = sweep_plan.Run('listops', 'transformer', 'smoke', str(tmp_path))
  workdir = run.workdir
  config = listops.get_config('transformer,smoke')
  make_run(workdir, config, results_of('listops'))
  assert rundir.check_resume(config, workdir) == {}
  config.learning_rate = config.learning_rate / 2
  changes = rundir.check_resume(config, workdir)
  assert list(changes) == ['learning_rate']
  rundir.write_config(config, workdir, resuming=True, changes=changes, step=6)
  config.grad_clip_norm = 1.0
  more = rundir.check_resume(config, workdir)
  assert list(more) == ['grad_clip_norm']  # the saved config has the lr
  rundir.write_config(config, workdir, resuming=True, changes=more, step=9)
  saved = rundir.read_config(workdir)
  history = saved[rundir.CHANGES_KEY]
  assert [h['step'] for h in history] == [6, 9]
  assert history[0]['changes']['learning_rate'][1] == config.learning_rate
  assert rundir.changed_keys(saved) == ['grad_clip_norm', 'learning_rate']
  assert rundir.without_changes(saved) == json.loads(config.to_json())
  # The sweep's "finished" compares the config alone, not the record.
  assert sweep_run.finished(run, config)
  config.num_train_steps = 7  # past results.json's last_step
  assert not sweep_run.finished(run, config)
  config.num_train_steps = 6
  # A fresh (not resuming) write drops the record.
  rundir.write_config(config, workdir)
  assert rundir.CHANGES_KEY not in rundir.read_config(workdir)


def test_check_resume_refuses_a_different_model(tmp_path):
  workdir = str(tmp_path)
  config = listops.get_config('transformer,smoke')
  make_run(workdir, config, results_of('listops'))
  config.model.num_layers = config.model.num_layers + 1
  with pytest.raises(UserError, match='model.num_layers differ'):
    rundir.check_resume(config, workdir)
  (tmp_path / 'config.json').write_text('not json')
  with pytest.raises(UserError, match='not a readable config'):
    rundir.check_resume(config, workdir)


# ----------------------------------------------------------- labels
def test_attention_options_label_the_row(tmp_path):
  base = listops.get_config('reformer,smoke')
  plain = results_of('listops', 'reformer')
  hashed = results_of(
    'listops', 'reformer', attention_options={'num_hashes': 8}
  )
  assert report.run_label(plain, json.loads(base.to_json())) == (
    'reformer [smoke]'
  )
  saved = json.loads(base.to_json())
  saved['model']['attention']['num_hashes'] = 8
  # Shown before the brackets, not again among the differences.
  assert report.run_label(hashed, saved) == 'reformer (num_hashes=8) [smoke]'
  for name, results, config in (
    ('a', plain, json.loads(base.to_json())),
    ('b', hashed, saved),
    ('c', hashed, saved),
  ):
    os.makedirs(tmp_path / name)
    with open(tmp_path / name / 'config.json', 'w') as f:
      json.dump(config, f)
    rundir.write_results(str(tmp_path / name), results)
  groups = report.group_runs(report.read_runs(str(tmp_path)))
  assert [(g['label'], g['n']) for g in groups] == [
    ('reformer (num_hashes=8) [smoke]', 2),
    ('reformer [smoke]', 1),
  ]
  table = report.accuracy_table(str(tmp_path))
  assert '| reformer (num_hashes=8) [smoke] |' in table
  assert '| reformer [smoke] |' in table
