"""The LRA accuracy table (Table 1) of our runs beside the paper's.

Runs are grouped by their effective config, never by model name alone. A
run's row label is its model, then in brackets its preset and every config
value that differs from the config its task file, model and preset give
today (`configs/<task>.py:<model>[,<preset>]`), e.g.
`transformer [small, num_layers=1, max_length=64]` (`model.` is dropped
from the keys). Runs whose labels, model selection and data source agree
differ only in the fields below and are averaged (mean, population std,
count n):

  seed                    averaged over: the point of repeated runs;
  data_dir, eval_batch_size, log_every_steps, checkpoint_every_steps,
  keep_checkpoints        bookkeeping: evaluation is exact whatever its
                          batch, and logs and saves never touch training.

Everything else labels the row, including num_train_steps and
eval_every_steps (the cadence chooses the best-validation checkpoint). A
run resumed with changed optimiser settings adds `resumed with <keys>`; a
field the run's config.json lacks (added to the code later) is no
difference.

Each run reports one test accuracy, chosen by its model selection
(results.json `select`, lra/metrics.py): the best-validation checkpoint's
(`test`) or the final step's (`test_last`, marked ‡). Rows whose data were
generated here rather than read from the release files are marked †.

A fine-tune (config init_from, lra/pretrained.py) shows the run it started
from by that run's preset and differences, `init_from=(small, spt)` (with
its model first when it is another), not by its folder: fine-tunes of the
same recipe share a row across tasks. Runs of an LM objective (causal_lm,
masked_lm: pretraining) have no accuracy: `tables` lists them apart with
their losses (pretraining_table).
"""

import functools
import glob
import importlib
import json
import os

import numpy as np

from lra.errors import UserError
from lra.metrics import SELECTED_KEY, flatten, selection

TASK_COLUMNS = ('listops', 'text', 'retrieval', 'image', 'pathfinder', 'pathx')
_PAPER = os.path.join(os.path.dirname(__file__), 'reference', 'lra_paper.json')
# Averaged over (seed) or bookkeeping: never label a row (see above).
IGNORED = (
  'seed',
  'data_dir',
  'eval_batch_size',
  'log_every_steps',
  'checkpoint_every_steps',
  'keep_checkpoints',
)
# The row's identity, shown apart.
IDENTITY = ('task', 'model_name', 'preset')
GENERATED_MARK, LAST_MARK = '†', '‡'


def paper():
  with open(_PAPER) as f:
    return json.load(f)


@functools.lru_cache(maxsize=None)
def _reference_json(task, model, preset):
  # configs/ is imported here only: the table is its one user in lra/.
  try:
    module = importlib.import_module(f'configs.{task}')
    arg = ','.join([model] + [p for p in preset.split(',') if p])
    return module.get_config(arg).to_json()
  except Exception:  # pylint: disable=broad-except  (unknown model, preset)
    return None


def reference_config(task, model, preset=''):
  """The config `configs/<task>.py:<model>[,<preset>]` gives, as a dict;
  None when that no longer builds (an unknown model or preset)."""
  text = _reference_json(task, model, preset or '')
  return None if text is None else json.loads(text)


def _value(v):
  return f'{v:g}' if isinstance(v, float) else str(v)


def config_differences(config, reference):
  """['num_layers=1', 'max_length=64', ...]: the run's values that differ
  from the reference config, keys sorted, IGNORED and IDENTITY left out.
  A key the run's config lacks is a field added after the run was made (a
  new field keeps the old behaviour by default): not a difference."""
  run, ref = flatten(config), flatten(reference)
  out = []
  for key in sorted(run):
    if key in IGNORED or key in IDENTITY or key.startswith('resume_changes'):
      continue
    if run[key] != ref.get(key, object()):
      shown = key[len('model.') :] if key.startswith('model.') else key
      value = _value(run[key])
      if key == 'init_from':
        value = source_label(run[key], config.get('model_name'))
      out.append(f'{shown}={value}')
  return out


def source_label(init_from, model):
  """'(small, spt)': the run a fine-tune started from, by its preset and
  differences (its model first when not `model`); '(<folder name>)' when
  its results.json or config.json cannot be read from here."""
  results = _load(os.path.join(init_from, 'results.json'))
  config = _load(os.path.join(init_from, 'config.json'))
  if not results or not config:
    return f'({os.path.basename(os.path.normpath(init_from))})'
  label = run_label(results, config)
  head, _, inner = label.partition(' [')
  inner = inner[:-1] if inner else ''
  if head != model:
    inner = f'{head}: {inner}' if inner else head
  return f'({inner})'


def run_label(results, config):
  """`model [preset, differences]` of one run (see the module docstring)."""
  model, preset = results['model'], results.get('preset') or ''
  parts = [p for p in preset.split(',') if p]
  if config is None:
    parts.append('config unknown')
  else:
    reference = reference_config(results['task'], model, preset)
    if reference is None:
      parts.append('no reference config')
    else:
      parts += config_differences(config, reference)
    changed = sorted(
      {k for c in config.get('resume_changes', []) for k in c['changes']}
    )
    if changed:
      parts.append(f'resumed with {"/".join(changed)}')
  return f'{model} [{", ".join(parts)}]' if parts else model


def _load(path):
  try:
    with open(path) as f:
      return json.load(f)
  except (OSError, ValueError):
    return None


def read_runs(runs_dir):
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
      f'No results.json below {runs_dir}; finish a train.py run there first.'
    )
  runs = []
  for path in paths:
    results = _load(path)
    if results is None:
      raise UserError(f'{path} is not valid JSON; rerun or remove that run.')
    if results.get('objective', 'classify') != 'classify':
      continue  # a pretraining run (causal_lm, masked_lm): no class accuracy
    config = _load(os.path.join(os.path.dirname(path), 'config.json'))
    select = results.get('select') or (
      selection(config) if config else 'best_val'
    )
    if SELECTED_KEY[select] not in results:  # made before test_last existed
      select = 'best_val'
    last = results.get('test_last')
    runs.append(
      {
        'task': results['task'],
        'model': results['model'],
        'label': run_label(results, config),
        'select': select,
        'accuracy': 100.0 * results[SELECTED_KEY[select]]['accuracy'],
        'best': 100.0 * results['test']['accuracy'],
        'last': None if last is None else 100.0 * last['accuracy'],
        'data': results.get('data_source', 'unknown'),
        'seed': (config or {}).get('seed'),
        'path': os.path.dirname(path),
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

  Returns a sorted list of dicts: task, label, model, select, data, n,
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


def lra_average(scores):
  """The LRA average: mean over the five tasks without Path-X, or None."""
  vals = [scores.get(t) for t in TASK_COLUMNS[:5]]
  return None if any(v is None for v in vals) else float(np.mean(vals))


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


def paper_value(table1, model, task):
  ref = table1.get(model)
  return None if ref is None else ref[table1['columns'].index(task)]


LEGEND = (
  "Test accuracy (%): ours, with the LRA paper's in brackets. A row is one "
  'effective config: `[...]` gives its preset and every config value that '
  'differs from `configs/<task>.py:<model>[,<preset>]` (`model.` dropped; '
  'seed and bookkeeping fields aside, lra/report.py). Runs of one config '
  'are averaged: ± is the population std over n runs. Each run reports its '
  "best-validation checkpoint's test accuracy, or (" + LAST_MARK + ') its '
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
  for g in groups:
    rows.setdefault(g['label'], {})[g['task']] = g
  model_of = {g['label']: g['model'] for g in groups}
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
    '| model | ' + ' | '.join(TASK_COLUMNS) + ' | avg |',
    '|' + '---|' * (len(TASK_COLUMNS) + 2),
  ]
  for label in labels:
    cells = []
    for t in TASK_COLUMNS:
      g = rows[label].get(t)
      ref = paper_value(table1, model_of[label], t)
      cell = '-' if g is None else _mean_cell(g) + _marks([g])
      cells.append(cell + (f' ({ref:.2f})' if ref is not None else ''))
    avg = lra_average({t: g['accuracy'] for t, g in rows[label].items()})
    ref = paper_value(table1, model_of[label], 'avg')
    cell = '-'
    if avg is not None:
      cell = f'{avg:.2f}' + _marks([rows[label][t] for t in TASK_COLUMNS[:5]])
    cells.append(cell + (f' ({ref:.2f})' if ref is not None else ''))
    lines.append(f'| {label} | ' + ' | '.join(cells) + ' |')
  lines += [
    '',
    'Runs by config: the test accuracy reported (selection), and both '
    "checkpoints' (best validation, final step).",
    '',
    '| task | model | n | seeds | reported | selection | best-val ckpt '
    '| final ckpt | data | paper |',
    '|' + '---|' * 10,
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
    ref = paper_value(table1, g['model'], g['task'])
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
      '-' if ref is None else f'{ref:.2f}',
    ]
    lines.append('| ' + ' | '.join(cells) + ' |')
  return '\n'.join(lines)


def pretraining_runs(runs_dir):
  """One dict per results.json of an LM objective below runs_dir: task,
  model, label, objective, best_step (lowest validation loss), val_loss,
  test_loss, token_accuracy (%), perplexity (causal_lm, else None), path."""
  paths = sorted(
    glob.glob(os.path.join(runs_dir, '**', 'results.json'), recursive=True)
  )
  runs = []
  for path in paths:
    results = _load(path)
    if not results or results.get('objective', 'classify') == 'classify':
      continue
    config = _load(os.path.join(os.path.dirname(path), 'config.json'))
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
    'labels; lra/objectives.py): the checkpoint of lowest validation loss, '
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


def read_benchmark(bench_dir):
  """The rows of bench_dir/benchmark.json, written by benchmark.py."""
  path = os.path.join(bench_dir, 'benchmark.json')
  if not os.path.exists(path):
    raise UserError(
      f'No benchmark.json in {bench_dir}; run `python benchmark.py --out '
      f'{bench_dir}` first.'
    )
  with open(path) as f:
    return json.load(f)


def bubble_points(runs_dir, bench_dir):
  """The bubble chart's data: configs trained whose model was benchmarked.

  One point per row of the accuracy table (an effective config, labelled as
  there), at its model's speed and memory. Accuracy is the LRA average when
  every such row has the five tasks; otherwise the mean over the tasks they
  all have; otherwise each row's mean over its own tasks. Speed is steps/s
  at the longest length at which 'transformer' ran, relative to it (without
  a transformer row: absolute, at the longest length measured).

  Returns:
    (points, length, relative, accuracy_label); points are (row label,
    accuracy %, speed, peak memory bytes, tasks).
  """
  groups = group_runs(read_runs(runs_dir))
  rows = [r for r in read_benchmark(bench_dir) if r['status'] == 'ok']
  base = {r['length']: r for r in rows if r['model'] == 'transformer'}
  lengths = set(base) or {r['length'] for r in rows}
  if not lengths:
    raise UserError(
      f'{bench_dir}/benchmark.json has no successful cell; rerun benchmark.py.'
    )
  length = max(lengths)
  relative = length in base
  measured = {r['model']: r for r in rows if r['length'] == length}
  scores, model_of = {}, {}
  for g in groups:
    if g['model'] in measured:
      scores.setdefault(g['label'], {})[g['task']] = g['accuracy']
      model_of[g['label']] = g['model']
  if not scores:
    raise UserError(
      f'No model is both in the runs below {runs_dir} and measured at '
      f'{length} in {bench_dir}; benchmark the models you trained.'
    )
  common = set.intersection(*(set(s) for s in scores.values()))
  if all(lra_average(s) is not None for s in scores.values()):
    label, tasks = 'LRA average test accuracy (%)', TASK_COLUMNS[:5]
  elif common:
    tasks = [t for t in TASK_COLUMNS if t in common]
    label = f'test accuracy (%), mean over {", ".join(tasks)}'
  else:
    label, tasks = "test accuracy (%), mean over each model's tasks", None
  points = []
  for name, own in scores.items():
    r = measured[model_of[name]]
    used = sorted(own) if tasks is None else tasks
    speed = r['steps_per_sec']
    if relative:
      speed /= base[length]['steps_per_sec']
    accuracy = float(np.mean([own[t] for t in used]))
    points.append((name, accuracy, speed, r['peak_memory_bytes'], tuple(used)))
  return points, length, relative, label


def bubble_chart(runs_dir, bench_dir):
  """LRA's Figure 3: accuracy against speed, circle area = peak memory.

  One circle per row of the accuracy table (its label, e.g. `transformer
  [small]`) from the results.json files below runs_dir and
  bench_dir/benchmark.json (see bubble_points); the title gives the
  benchmark's machine, preset and batch. Writes and returns
  bench_dir/lra_bubble.png.
  """
  import matplotlib  # pylint: disable=g-import-not-at-top

  matplotlib.use('Agg')
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top

  points, length, relative, label = bubble_points(runs_dir, bench_dir)
  largest = max(p[3] for p in points)
  own_tasks = len({p[4] for p in points}) > 1
  fig, ax = plt.subplots(figsize=(7, 5))
  for model, accuracy, speed, memory, tasks in points:
    ax.scatter(speed, accuracy, s=2500 * memory / largest, alpha=0.45)
    name = f'{model} ({", ".join(tasks)})' if own_tasks else model
    ax.annotate(name, (speed, accuracy), ha='center', va='center', fontsize=8)
  ax.margins(0.25)
  ax.set_xlabel(
    f'speed at length {length}: steps/s '
    + ('relative to transformer' if relative else '(absolute)')
  )
  ax.set_ylabel(label)
  from lra.bench_report import setup  # pylint: disable=g-import-not-at-top

  ax.set_title(
    f'circle area = peak memory at {length} (XLA memory analysis); '
    f'largest {largest / 1e9:.3g} GB\n'
    f'{setup(read_benchmark(bench_dir)[0])}',
    fontsize=9,
  )
  ax.grid(True, alpha=0.3)
  fig.tight_layout()
  path = os.path.join(bench_dir, 'lra_bubble.png')
  fig.savefig(path, dpi=120)
  plt.close(fig)
  return path
