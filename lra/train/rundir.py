"""The run directory's schema: what train.py leaves in a --workdir and the
one reading of it that eval.py, the table and the sweep share.

  <workdir>/config.json     the run's config (ConfigDict.to_json), plus
                            CHANGES_KEY ('resume_changes'): a list of
                            {'step': N, 'changes': {key: [old, new]}}, one
                            per resumption that changed optimiser settings
                            (not a config field: strip it before comparing);
  <workdir>/results.json    task, model, preset, objective, best_step, val,
                            test (the best-validation checkpoint's test
                            metrics), last_step, test_last (the final
                            step's), select (which of the two the table
                            reports; absent for an LM objective and in runs
                            made before it existed), data_source, and
                            attention_options (the model.attention options
                            the run changed from its model's defaults; absent
                            in older runs);
  <workdir>/metrics.jsonl   one row per log line (lra/train/metrics.py);
  <workdir>/checkpoints/{latest,best}/<step>/   saves (lra/train/checkpoints.py).

The selected test accuracy (selection_of, selected_test) has one rule:
results.json `select` when present; without it, what train.py would write
today, lra/train/metrics.py `selection` of the run's config.json (`last` when the
validation split is the test set, else `best_val`), or `best_val` without a
readable config; and `best_val` when the chosen entry is missing (a run made
before `test_last` existed). An LM objective (causal_lm, masked_lm) has no
selection (None).

Nothing here imports jax: the sweep reads run directories without it.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

from lra.errors import UserError
from lra.train.metrics import SELECTED_KEY, flatten, selection, write_json

if TYPE_CHECKING:
  import ml_collections

CONFIG, RESULTS = 'config.json', 'results.json'

# Config keys that may change between a run and its resumption.
RESUMABLE_CHANGES = (
  'num_train_steps',
  'eval_every_steps',
  'log_every_steps',
  'checkpoint_every_steps',
  'checkpoint_every_minutes',
  'prefetch',
  'keep_checkpoints',
  'data_dir',
  'eval_batch_size',
  'select',
  'wandb_project',
  'wandb_mode',
)
# Optimiser settings that may change on resumption (e.g. after a non-finite
# loss: a lower learning rate or clipping from the last good checkpoint on).
# They change closures, not the optimizer state's structure (lra.train.steps); the
# change is recorded in config.json (CHANGES_KEY: step, old and new values)
# and as a metrics.jsonl row of split 'config'.
OPTIMISER_CHANGES = (
  'learning_rate',
  'schedule',
  'warmup_steps',
  'weight_decay',
  'adam_b1',
  'adam_b2',
  'adam_eps',
  'grad_clip_norm',
  'ssm_learning_rate',
  'ssm_weight_decay',
)
# The record of those changes in config.json (not a config field).
CHANGES_KEY = 'resume_changes'
# results.json: the model.attention options a run changed from its model's
# defaults (lra/train/options.py MODELS), written by train.py.
ATTENTION_OPTIONS_KEY = 'attention_options'


# ------------------------------------------------------------ files
def read_json(path: str) -> Any | None:
  """The JSON in `path`, or None when it is missing or not valid JSON."""
  try:
    with open(path) as f:
      return json.load(f)
  except (OSError, ValueError):
    return None


def damage(path: str) -> str | None:
  """Why the file at `path` cannot be read as JSON ('is a directory',
  'is not UTF-8 text (binary bytes)', 'is not valid JSON (line 3,
  column 9)', 'cannot be read: Permission denied'), or None when it reads
  (or is missing)."""
  if not os.path.lexists(path):
    return None
  if os.path.isdir(path):
    return 'is a directory, not a file'
  try:
    with open(path, 'rb') as f:
      raw = f.read()
  except OSError as e:
    return f'cannot be read ({e.strerror or e})'
  try:
    text = raw.decode('utf-8')
  except UnicodeDecodeError as e:
    return f'is not UTF-8 text (binary bytes at byte {e.start})'
  if not text.strip():
    return 'is empty'
  try:
    json.loads(text)
  except ValueError as e:
    line, col = getattr(e, 'lineno', None), getattr(e, 'colno', None)
    where = f' (line {line}, column {col})' if line else ''
    return f'is not valid JSON{where}: truncated or damaged'
  return None


def load_json(path: str, kind: type | None = dict, what: str = '') -> Any:
  """The JSON in `path` (None when the file is missing); UserError naming
  the file and the damage when it exists but is not readable JSON, or not
  of `kind` (dict: a JSON object; list; None: any). For readers that must
  not take a damaged file for a missing one (a resume, a merge that would
  rewrite it). what: the advice (default: restore or move it away)."""
  why = damage(path)
  if why is None and os.path.lexists(path):
    with open(path) as f:
      data = json.load(f)
    if kind is None or isinstance(data, kind):
      return data
    names = {dict: 'a JSON object', list: 'a JSON list'}
    why = (
      f'holds {type(data).__name__} {str(data)[:40]!r}, not '
      f'{names.get(kind, kind.__name__)}'
    )
  if why is None:
    return None
  raise UserError(
    f'{path} {why}; '
    + (what or 'restore it from a copy or move it away, then run again.')
  )


# ------------------------------------------------- a run of this project
# What makes a folder a run of this project (train.py resumes it; any other
# non-empty folder is refused unless --allow_foreign_workdir): a
# config.json written by train.py (a JSON object with all of RUN_KEYS), or,
# without a config.json, a metrics.jsonl whose first row has a step and a
# split, or a checkpoints/ folder holding only what lra/train/checkpoints.py
# makes. Files written before any of those (the lock, a sweep's train.log)
# leave a folder empty.
RUN_KEYS = ('task', 'model', 'num_train_steps', 'learning_rate', 'batch_size')
CHECKPOINT_FOLDERS = ('latest', 'best', 'records', 'unreadable')
BEFORE_A_RUN = ('.lock', 'train.log')


def _ours_config(path: str) -> bool:
  try:
    with open(path) as f:
      data = json.load(f)
  except (OSError, ValueError):
    return False
  return (
    isinstance(data, dict)
    and all(k in data for k in RUN_KEYS)
    and isinstance(data['model'], dict)
  )


def _ours_metrics(path: str) -> bool:
  try:
    with open(path) as f:
      first = f.readline()
    row = json.loads(first)
  except (OSError, ValueError):
    return False
  return isinstance(row, dict) and 'step' in row and 'split' in row


def _ours_checkpoints(path: str) -> bool:
  try:
    names = os.listdir(path)
  except OSError:
    return False
  return all(n in CHECKPOINT_FOLDERS for n in names)


def foreign_files(workdir: str) -> list[str]:
  """[] when `workdir` is missing, empty (but for BEFORE_A_RUN) or a run
  of this project (see RUN_KEYS); else the names of its entries, sorted,
  the file that makes it foreign first (a config.json not written by
  train.py, which a run would overwrite)."""
  try:
    names = sorted(os.listdir(workdir))
  except OSError:  # missing (or not a folder: check_dir says so)
    return []
  if not [n for n in names if n not in BEFORE_A_RUN]:
    return []
  config = os.path.join(workdir, CONFIG)
  first = [CONFIG, *(n for n in names if n != CONFIG)]
  if os.path.lexists(config):
    if _ours_config(config):
      return []
    if damage(config) is None:  # readable JSON, someone else's
      return first
    # A damaged config.json: the run's own when the rest of it says so (its
    # resume then names the damage), else a stranger's.
  metrics = os.path.join(workdir, 'metrics.jsonl')
  ckpts = os.path.join(workdir, 'checkpoints')
  if os.path.isfile(metrics) and _ours_metrics(metrics):
    return []
  if os.path.isdir(ckpts) and _ours_checkpoints(ckpts):
    return []
  return first if os.path.lexists(config) else names


def check_not_foreign(workdir: str) -> None:
  """UserError (one sentence) when `workdir` holds files that are not a
  run of this project (foreign_files): a training would write its
  config.json, metrics.jsonl and checkpoints among them."""
  names = foreign_files(workdir)
  if not names:
    return
  shown = ', '.join(names[:4]) + (', ...' if len(names) > 4 else '')
  raise UserError(
    f'--workdir {workdir} holds files that are not a run of this project '
    f'({shown}); give a new or empty folder, or add '
    '--allow_foreign_workdir to train in it anyway (a config.json or '
    'metrics.jsonl there is overwritten).'
  )


def read_results(workdir: str) -> dict | None:
  """workdir/results.json, or None (no finished run, or unreadable)."""
  results = read_json(os.path.join(workdir, RESULTS))
  return results if isinstance(results, dict) else None


def read_config(workdir: str) -> dict | None:
  """workdir/config.json as written (CHANGES_KEY included), or None."""
  config = read_json(os.path.join(workdir, CONFIG))
  return config if isinstance(config, dict) else None


def write_results(workdir: str, results: dict) -> str:
  """Writes workdir/results.json atomically; returns its path."""
  path = os.path.join(workdir, RESULTS)
  write_json(path, results)
  return path


def without_changes(saved: dict) -> dict:
  """A config.json's config alone: a copy without CHANGES_KEY."""
  return {k: v for k, v in saved.items() if k != CHANGES_KEY}


def resume_changes(saved: dict | None) -> list:
  """config.json's record of optimiser changes on resuming (maybe [])."""
  return list((saved or {}).get(CHANGES_KEY) or [])


def changed_keys(saved: dict | None) -> list[str]:
  """The config keys any resumption changed, sorted."""
  return sorted({k for c in resume_changes(saved) for k in c['changes']})


def attention_options(results: dict) -> dict:
  """results.json's model.attention options that differ from the model's
  defaults, flattened ({'num_hashes': 8}); {} when absent (older runs)."""
  return flatten(results.get(ATTENTION_OPTIONS_KEY) or {})


def saved_steps(workdir: str) -> dict[str, list[int]]:
  """{'latest': [...], 'best': [...]}: the saved steps, from the checkpoint
  folders' names alone (opens nothing, creates nothing)."""
  out = {}
  for which in ('latest', 'best'):
    path = os.path.join(workdir, 'checkpoints', which)
    names = os.listdir(path) if os.path.isdir(path) else []
    out[which] = sorted(int(n) for n in names if n.isdigit())
  return out


def latest_step(workdir: str) -> int:
  """The newest saved training step (checkpoints/latest), or 0."""
  return max(saved_steps(workdir)['latest'], default=0)


# -------------------------------------------------------- selection
# The objectives whose results hold accuracies (lra/train/objectives.py): a
# classification per example, or per labelled position (mqar); the others
# (causal_lm, masked_lm) are pretraining runs with losses.
ACCURACY_OBJECTIVES = ('classify', 'per_position')


def is_lm_run(results: dict) -> bool:
  """True for a run of an LM objective (pretraining: no accuracy)."""
  return results.get('objective', 'classify') not in ACCURACY_OBJECTIVES


def selection_of(results: dict, config: dict | None = None) -> str | None:
  """Which test entry of `results` the run reports: 'best_val' (`test`) or
  'last' (`test_last`); None for an LM objective. `config` is the run's
  config.json, read only when results.json has no `select` (see the
  module docstring for the rule)."""
  if is_lm_run(results):
    return None
  select = results.get('select')
  if not select:
    select = selection(config) if config else 'best_val'
  if SELECTED_KEY.get(select) not in results:  # made before test_last
    select = 'best_val'
  return select


def selected_test(results: dict, config: dict | None = None) -> dict | None:
  """The test metrics the run reports (`test` or `test_last`, by
  selection_of); None for an LM objective or when results has no test."""
  select = selection_of(results, config)
  return None if select is None else results.get(SELECTED_KEY[select])


# ---------------------------------------------------------- resuming
def check_resume(
  config: ml_collections.ConfigDict,
  workdir: str,
  defaults: ml_collections.ConfigDict | None = None,
) -> dict[str, tuple]:
  """Compares the config with the run saved in `workdir` (when it has
  checkpoints); returns {leaf key: (old, new)} of the optimiser settings
  that changed, or raises UserError naming the leaf keys that may not
  change. Writes nothing. `defaults` (train.py passes configs/base.py's):
  the values of fields a saved run predates."""
  saved = saved_steps(workdir)
  path = os.path.join(workdir, CONFIG)
  if not (saved['latest'] or saved['best']) or not os.path.exists(path):
    return {}
  old = read_config(workdir)
  if old is None:
    raise UserError(
      f'{path} is not a readable config (not a JSON object); restore it or '
      'use a new --workdir.'
    )
  old = flatten(without_changes(old))
  new = flatten(json.loads(config.to_json()))
  # A field added after the run was made (e.g. objective) had its default
  # then: a run saved without it resumes when it still has that value.
  known = {} if defaults is None else flatten(json.loads(defaults.to_json()))
  for k, v in known.items():
    if k not in old and k in new:
      old[k] = v
  differ = sorted(
    k
    for k in set(old) | set(new)
    if old.get(k) != new.get(k) and k not in RESUMABLE_CHANGES
  )
  fixed = [k for k in differ if k not in OPTIMISER_CHANGES]
  if fixed:
    shown = ', '.join(fixed[:6]) + (', ...' if len(fixed) > 6 else '')
    raise UserError(
      f'{workdir} holds a run with a different config ({shown} differ); '
      'use a new --workdir to start another run (only the optimiser '
      'settings, e.g. --config.learning_rate, may change on resuming).'
    )
  return {k: (old.get(k), new.get(k)) for k in differ}


def write_config(
  config: ml_collections.ConfigDict,
  workdir: str,
  resuming: bool = False,
  changes: dict[str, tuple] | None = None,
  step: int | None = None,
) -> None:
  """Creates the workdir and writes config.json; a resumed run keeps the
  record of earlier changes and appends `changes` (from check_resume), made
  at `step`."""
  history = resume_changes(read_config(workdir)) if resuming else []
  if changes:
    history.append(
      {'step': step, 'changes': {k: list(v) for k, v in changes.items()}}
    )
  new = json.loads(config.to_json())
  if history:
    new[CHANGES_KEY] = history
  os.makedirs(workdir, exist_ok=True)
  write_json(os.path.join(workdir, CONFIG), new)
