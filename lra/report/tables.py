"""The LRA accuracy table (Table 1) of our runs beside the paper's.

Runs are grouped by their effective config, never by model name alone. A
run's row label is its model; then in parentheses the attention options it
changed from its model's defaults (results.json `attention_options`, written
by train.py; absent in older runs), e.g. `reformer (num_hashes=8)`; then in
brackets its preset and every other config value that differs from the
config its task file, model and preset give today
(`configs/<task>.py:<model>[,<preset>]`), e.g.
`transformer [small, num_layers=1, max_length=64]` (`model.` is dropped
from the keys). Runs of one (task, model) with different attention options
are separate rows. Runs whose labels, model selection and data source agree
differ only in the fields below and are averaged (mean, population std,
count n):

  seed                    averaged over: the point of repeated runs;
  data_dir, eval_batch_size, log_every_steps, checkpoint_every_steps,
  keep_checkpoints,       bookkeeping: evaluation is exact whatever its
  wandb_project,          batch, and logs and saves never touch training.
  wandb_mode

Everything else labels the row, including num_train_steps and
eval_every_steps (the cadence chooses the best-validation checkpoint). A
run resumed with changed optimiser settings adds `resumed with <keys>`; a
field the run's config.json lacks (added to the code later) is no
difference.

Each row has a scale (SCALES): the size of the recipe it ran. Only a
`reference` row (no small or smoke preset, no config value changed from
the task file's) gets the LRA paper's number beside it: a small or smoke
result is a CPU-sized recipe (fewer layers and steps, shorter inputs), not
a measurement of the paper's setting.

Each run reports one test accuracy, chosen by its model selection
(results.json `select`; without it lra/train/metrics.py `selection` of its
config.json: the rule of lra/train/rundir.py selection_of): the best-validation
checkpoint's (`test`) or the final step's (`test_last`, marked ‡). Rows
whose data were generated here rather than read from the release files are
marked †.

A fine-tune (config init_from, lra/train/pretrained.py) shows the run it started
from by that run's preset and differences, `init_from=(small, spt)` (with
its model first when it is another), not by its folder: fine-tunes of the
same recipe share a row across tasks. Runs of an LM objective (causal_lm,
masked_lm: pretraining) have no accuracy: `tables` lists them apart with
their losses (pretraining_table).

The paper's numbers are lra/report/paper.py's; the benchmark's bubble chart,
which reads these runs, is lra/bench/report.py's (this module does not import
it).
"""

from __future__ import annotations

import functools
import glob
import json
import os

import numpy as np

from lra import commands
from lra.errors import UserError
from lra.report.paper import TASK_COLUMNS, lra_average, paper, paper_value
from lra.train import config as config_loader
from lra.train import rundir
from lra.train.metrics import flatten

# Averaged over (seed) or bookkeeping: never label a row (see above).
IGNORED = (
  'seed',
  'data_dir',
  'eval_batch_size',
  'log_every_steps',
  'checkpoint_every_steps',
  'keep_checkpoints',
  'wandb_project',
  'wandb_mode',
)
# The row's identity, shown apart.
IDENTITY = ('task', 'model_name', 'preset')
GENERATED_MARK, LAST_MARK = '†', '‡'
# A row's scale: its preset's size, `reference` when neither small nor smoke
# is in it (spt, a recipe on top, keeps the scale), `reference, changed`
# when its config differs from the reference (or is unknown). Only
# `reference` rows sit beside the paper's numbers.
SCALES = ('reference', 'reference, changed', 'small', 'smoke')


@functools.lru_cache(maxsize=None)
def _reference_json(task, model, preset):
  try:
    arg = ','.join([model] + [p for p in preset.split(',') if p])
    return config_loader.task_config(task, arg).to_json()
  except Exception:  # pylint: disable=broad-except  (unknown model, preset)
    return None


def reference_config(task, model, preset=''):
  """The config `configs/<task>.py:<model>[,<preset>]` gives, as a dict;
  None when that no longer builds (an unknown model or preset)."""
  text = _reference_json(task, model, preset or '')
  return None if text is None else json.loads(text)


def _value(v):
  return f'{v:g}' if isinstance(v, float) else str(v)


def config_differences(
  config: dict, reference: dict, shown_apart: tuple[str, ...] = ()
) -> list[str]:
  """['num_layers=1', 'max_length=64', ...]: the run's values that differ
  from the reference config, keys sorted, IGNORED and IDENTITY left out.
  A key the run's config lacks is a field added after the run was made (a
  new field keeps the old behaviour by default): not a difference. Keys in
  `shown_apart` (flattened, e.g. 'model.attention.num_hashes': the label
  shows them before the brackets) are left out too."""
  run, ref = flatten(config), flatten(reference)
  out = []
  for key in sorted(run):
    if (
      key in IGNORED
      or key in IDENTITY
      or key in shown_apart
      or key.startswith(rundir.CHANGES_KEY)
    ):
      continue
    if run[key] != ref.get(key, object()):
      shown = key[len('model.') :] if key.startswith('model.') else key
      value = _value(run[key])
      if key == 'init_from':
        value = source_label(run[key], config.get('model_name'))
      out.append(f'{shown}={value}')
  return out


def source_label(init_from: str, model: str | None) -> str:
  """'(small, spt)': the run a fine-tune started from, by its preset and
  differences (its model, with its attention options, first when that is
  not `model`); '(<folder name>)' when its results.json or config.json
  cannot be read from here."""
  results = rundir.read_results(init_from)
  config = rundir.read_config(init_from)
  if not results or not config:
    return f'({os.path.basename(os.path.normpath(init_from))})'
  label = run_label(results, config)
  head, _, inner = label.partition(' [')
  inner = inner[:-1] if inner else ''
  if head != model:
    inner = f'{head}: {inner}' if inner else head
  return f'({inner})'


def model_label(results: dict) -> str:
  """`reformer (num_hashes=8)`: the model, then the attention options the
  run changed from its model's defaults (results.json attention_options,
  keys sorted); the model alone when there are none or the run predates
  that key."""
  options = rundir.attention_options(results)
  shown = ', '.join(f'{k}={_value(v)}' for k, v in sorted(options.items()))
  return f'{results["model"]} ({shown})' if shown else results['model']


def run_scale(results: dict, config: dict | None) -> str:
  """The run's scale (SCALES): `smoke` or `small` by its preset, else
  `reference` when its config is the one its task file, model and preset
  give (attention options aside), `reference, changed` when not or when
  that cannot be told."""
  presets = (results.get('preset') or '').split(',')
  for scale in ('smoke', 'small'):
    if scale in presets:
      return scale
  if config is None:
    return 'reference, changed'
  reference = reference_config(
    results['task'], results['model'], ','.join(presets)
  )
  apart = tuple(
    f'model.attention.{k}' for k in rundir.attention_options(results)
  )
  if reference is None or config_differences(config, reference, apart):
    return 'reference, changed'
  return 'reference, changed' if rundir.changed_keys(config) else 'reference'


def run_label(results: dict, config: dict | None) -> str:
  """`model (attention options) [preset, differences]` of one run (see the
  module docstring); an attention option shown in brackets is not repeated
  among the differences."""
  model, preset = results['model'], results.get('preset') or ''
  apart = tuple(
    f'model.attention.{k}' for k in rundir.attention_options(results)
  )
  parts = [p for p in preset.split(',') if p]
  if config is None:
    parts.append('config unknown')
  else:
    reference = reference_config(results['task'], model, preset)
    if reference is None:
      parts.append('no reference config')
    else:
      parts += config_differences(config, reference, apart)
    changed = rundir.changed_keys(config)
    if changed:
      parts.append(f'resumed with {"/".join(changed)}')
  head = model_label(results)
  return f'{head} [{", ".join(parts)}]' if parts else head


def read_runs(runs_dir: str) -> list[dict]:
  """One dict per results.json below runs_dir: task, model, label, select,
  accuracy (the selected test accuracy, %), best and last (the two test
  accuracies, %; last None for runs made before test_last existed), data
  (results' data_source), seed and path. Runs of an LM objective
  (results.json `objective` causal_lm or masked_lm: pretraining, token
  metrics) are left out: they have no classification accuracy."""
  paths = sorted(
    glob.glob(os.path.join(runs_dir, '**', 'results.json'), recursive=True)
  )
  if not paths:
    raise UserError(
      f'No results.json below {runs_dir}; finish a run there first '
      f'(`{commands.program("train")} --config ... --workdir '
      f'{os.path.join(runs_dir, "NAME")}`).'
    )
  runs = []
  for path in paths:
    workdir = os.path.dirname(path)
    results = rundir.read_results(workdir)
    if results is None:
      why = rundir.damage(path) or 'is not a JSON object'
      raise UserError(f'{path} {why}; rerun or remove that run.')
    if rundir.is_lm_run(results):
      continue  # a pretraining run (causal_lm, masked_lm): no class accuracy
    config = rundir.read_config(workdir)
    select = rundir.selection_of(results, config)
    last = results.get('test_last')
    runs.append(
      {
        'task': results['task'],
        'model': results['model'],
        'label': run_label(results, config),
        'scale': run_scale(results, config),
        'select': select,
        'accuracy': 100.0 * rundir.selected_test(results, config)['accuracy'],
        'best': 100.0 * results['test']['accuracy'],
        'last': None if last is None else 100.0 * last['accuracy'],
        'data': results.get('data_source', 'unknown'),
        'seed': (config or {}).get('seed'),
        'path': workdir,
      }
    )
  if not runs:
    raise UserError(
      f'The runs below {runs_dir} are all pretraining runs (an LM '
      'objective); the table needs classification runs (fine-tunes).'
    )
  return runs


def group_runs(runs):
  """Runs with the same task, label, selection and data source, averaged.

  Returns a sorted list of dicts: task, label, model, scale, select, data, n,
  seeds, accuracies (one per run), accuracy (their mean), spread (their
  std), best and last (means of the two test accuracies), runs (paths). A
  label two groups of one task share (data generated for one, read for the
  other) gets `data=<source>, select=<selection>`.
  """
  groups = {}
  for r in runs:
    key = (r['task'], r['label'], r['select'], r['data'])
    groups.setdefault(key, []).append(r)
  shared = {}
  for task, label, _, _ in groups:
    shared[(task, label)] = shared.get((task, label), 0) + 1
  out = []
  for (task, label, select, data), members in sorted(groups.items()):
    if shared[(task, label)] > 1:
      inner = label[:-1] + ', ' if label.endswith(']') else label + ' ['
      label = f'{inner}data={data}, select={select}]'
    accuracy = [r['accuracy'] for r in members]
    lasts = [r['last'] for r in members]
    out.append(
      {
        'task': task,
        'label': label,
        'model': members[0]['model'],
        'scale': members[0]['scale'],
        'select': select,
        'data': data,
        'n': len(members),
        'seeds': sorted({r['seed'] for r in members if r['seed'] is not None}),
        'accuracies': accuracy,
        'accuracy': float(np.mean(accuracy)),
        'spread': float(np.std(accuracy)),
        'best': float(np.mean([r['best'] for r in members])),
        'last': None if None in lasts else float(np.mean(lasts)),
        'runs': [r['path'] for r in members],
      }
    )
  return out


def collect_runs(runs_dir, with_preset=True):
  """{(task, row label): [selected test accuracy %, one per run]}.

  with_preset is kept for callers of the old signature: labels always
  carry the preset and the config differences now.
  """
  del with_preset
  return {
    (g['task'], g['label']): g['accuracies']
    for g in group_runs(read_runs(runs_dir))
  }


def _marks(groups):
  generated = any(g['data'] == 'generated' for g in groups)
  last = any(g['select'] == 'last' for g in groups)
  marks = (GENERATED_MARK if generated else '') + (LAST_MARK if last else '')
  return f' {marks}' if marks else ''


def _mean_cell(g):
  if g['n'] == 1:
    return f'{g["accuracy"]:.2f}'
  return f'{g["accuracy"]:.2f} ±{g["spread"]:.2f} n={g["n"]}'


def _column(task):
  return TASK_COLUMNS.index(task) if task in TASK_COLUMNS else len(TASK_COLUMNS)


LEGEND = (
  "Test accuracy (%) of our runs. Scale: the recipe's size (reference: the "
  'LRA configuration; small: the CPU recipe; smoke: seconds, for tests; '
  'reference, changed: the reference preset with config values changed). '
  "The LRA paper's number is in brackets beside reference rows only: a "
  'small or smoke result is not comparable with it. A row is one '
  'effective config: `[...]` gives its preset and every config value that '
  'differs from `configs/<task>.py:<model>[,<preset>]` (`model.` dropped; '
  'seed and bookkeeping fields aside, lra/report/tables.py). Runs of one '
  'config are averaged: ± is the population std over n runs. Each run '
  "reports its best-validation checkpoint's test accuracy, or ("
  + LAST_MARK
  + ') its '
  "final step's (select=last, as the LRA reference). " + GENERATED_MARK + ' '
  "data generated by this project's generators, not read from the LRA "
  'release files the paper used.'
)


def accuracy_table(runs_dir):
  """Markdown: LRA Table 1 (one row per effective config), then every
  group of runs with both of its test accuracies."""
  groups = group_runs(read_runs(runs_dir))
  table1 = paper()['table1_accuracy']
  rows = {}
  for g in groups:  # tasks beyond LRA (mqar) are in the second table only
    if g['task'] in TASK_COLUMNS:
      rows.setdefault(g['label'], {})[g['task']] = g
  model_of = {g['label']: g['model'] for g in groups}
  scale_of = {g['label']: g['scale'] for g in groups}
  # Paper models first; a model's reference row before its variants.
  labels = sorted(
    rows,
    key=lambda lb: (
      model_of[lb] not in table1,
      model_of[lb],
      lb.count(','),
      lb,
    ),
  )
  lines = [
    LEGEND,
    '',
    '| model | scale | ' + ' | '.join(TASK_COLUMNS) + ' | avg |',
    '|' + '---|' * (len(TASK_COLUMNS) + 3),
  ]
  for label in labels:
    beside = scale_of[label] == 'reference'  # the paper's number, comparable
    cells = [scale_of[label]]
    for t in TASK_COLUMNS:
      g = rows[label].get(t)
      ref = paper_value(table1, model_of[label], t) if beside else None
      cell = '-' if g is None else _mean_cell(g) + _marks([g])
      cells.append(cell + (f' ({ref:.2f})' if ref is not None else ''))
    avg = lra_average({t: g['accuracy'] for t, g in rows[label].items()})
    ref = paper_value(table1, model_of[label], 'avg') if beside else None
    cell = '-'
    if avg is not None:
      cell = f'{avg:.2f}' + _marks([rows[label][t] for t in TASK_COLUMNS[:5]])
    cells.append(cell + (f' ({ref:.2f})' if ref is not None else ''))
    lines.append(f'| {label} | ' + ' | '.join(cells) + ' |')
  lines += [
    '',
    'Runs by config: the test accuracy reported (selection), and both '
    "checkpoints' (best validation, final step); the paper's number for "
    'reference rows only.',
    '',
    '| task | model | n | seeds | reported | selection | best-val ckpt '
    '| final ckpt | data | scale | paper |',
    '|' + '---|' * 11,
  ]
  for g in sorted(
    groups,
    key=lambda g: (
      _column(g['task']),
      g['model'],
      g['label'].count(','),
      g['label'],
    ),
  ):
    ref = (
      paper_value(table1, g['model'], g['task'])
      if g['scale'] == 'reference'
      else None
    )
    cells = [
      g['task'],
      g['label'],
      str(g['n']),
      ' '.join(map(str, g['seeds'])) or '?',
      f'{g["accuracy"]:.2f}' + (f' ±{g["spread"]:.2f}' if g['n'] > 1 else ''),
      g['select'],
      f'{g["best"]:.2f}',
      '-' if g['last'] is None else f'{g["last"]:.2f}',
      g['data'],
      g['scale'],
      '-' if ref is None else f'{ref:.2f}',
    ]
    lines.append('| ' + ' | '.join(cells) + ' |')
  return '\n'.join(lines)


def pretraining_runs(runs_dir: str) -> list[dict]:
  """One dict per results.json of an LM objective below runs_dir: task,
  model, label, objective, best_step (lowest validation loss), val_loss,
  test_loss, token_accuracy (%), perplexity (causal_lm, else None), path."""
  paths = sorted(
    glob.glob(os.path.join(runs_dir, '**', 'results.json'), recursive=True)
  )
  runs = []
  for path in paths:
    results = rundir.read_results(os.path.dirname(path))
    if not results or not rundir.is_lm_run(results):
      continue
    config = rundir.read_config(os.path.dirname(path))
    test = results.get('test') or {}
    accuracy = test.get('token_accuracy')
    runs.append(
      {
        'task': results['task'],
        'model': results['model'],
        'label': run_label(results, config),
        'objective': results['objective'],
        'best_step': results.get('best_step'),
        'val_loss': (results.get('val') or {}).get('loss'),
        'test_loss': test.get('loss'),
        'token_accuracy': None if accuracy is None else 100.0 * accuracy,
        'perplexity': test.get('perplexity'),
        'path': os.path.dirname(path),
      }
    )
  return runs


def _number(x, spec):
  return '-' if x is None else format(x, spec)


def pretraining_table(runs_dir):
  """Markdown: one line per pretraining run (an LM objective) below
  runs_dir, or None when there is none."""
  runs = pretraining_runs(runs_dir)
  if not runs:
    return None
  lines = [
    "Pretraining runs (an LM objective on the task's own inputs, no "
    'labels; lra/train/objectives.py): the checkpoint of lowest validation '
    'loss, '
    'its validation and test loss, test token accuracy (%) over the '
    'positions counted and test perplexity (causal_lm).',
    '',
    '| task | model | objective | best step | val loss | test loss '
    '| token accuracy | perplexity |',
    '|' + '---|' * 8,
  ]
  for r in sorted(
    runs, key=lambda r: (_column(r['task']), r['model'], r['label'])
  ):
    cells = [
      r['task'],
      r['label'],
      r['objective'],
      _number(r['best_step'], 'd'),
      _number(r['val_loss'], '.4f'),
      _number(r['test_loss'], '.4f'),
      _number(r['token_accuracy'], '.2f'),
      _number(r['perplexity'], '.3f'),
    ]
    lines.append('| ' + ' | '.join(cells) + ' |')
  return '\n'.join(lines)


def tables(runs_dir):
  """`eval.py --table`: the accuracy table of the classification runs, then
  the pretraining runs' table (each when there are such runs)."""
  lm = pretraining_table(runs_dir)
  try:
    text = accuracy_table(runs_dir)
  except UserError:
    if lm is None:
      raise
    return lm
  return text if lm is None else f'{text}\n\n{lm}'
