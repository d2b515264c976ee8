"""The LRA accuracy table (Table 1) of our runs beside the paper's."""

import glob
import json
import os

import numpy as np

from lra.errors import UserError

TASK_COLUMNS = ('listops', 'text', 'retrieval', 'image', 'pathfinder', 'pathx')
_PAPER = os.path.join(os.path.dirname(__file__), 'reference', 'lra_paper.json')


def paper():
  with open(_PAPER) as f:
    return json.load(f)


def collect_runs(runs_dir, with_preset=False):
  """{(task, model): [test accuracy %, ...]} from every results.json below.

  with_preset: label runs of a preset apart, e.g. 'transformer [small]', so
  a CPU-sized run is never read as a reproduction of the paper's setting.
  """
  paths = sorted(
    glob.glob(os.path.join(runs_dir, '**', 'results.json'), recursive=True)
  )
  if not paths:
    raise UserError(
      f'No results.json below {runs_dir}; finish a train.py run there first.'
    )
  runs = {}
  for path in paths:
    with open(path) as f:
      r = json.load(f)
    model = r['model']
    if with_preset and r.get('preset'):
      model += f' [{r["preset"]}]'
    runs.setdefault((r['task'], model), []).append(
      100.0 * r['test']['accuracy']
    )
  return runs


def lra_average(scores):
  """The LRA average: mean over the five tasks without Path-X, or None."""
  vals = [scores.get(t) for t in TASK_COLUMNS[:5]]
  return None if any(v is None for v in vals) else float(np.mean(vals))


def accuracy_table(runs_dir):
  runs = collect_runs(runs_dir, with_preset=True)
  table1 = paper()['table1_accuracy']
  cols = table1['columns']
  models = sorted({m for _, m in runs}, key=lambda m: (m not in table1, m))
  head = '| model | ' + ' | '.join(TASK_COLUMNS) + ' | avg |'
  lines = [
    "Test accuracy (%): ours, with the LRA paper's in brackets; "
    '"±" is the spread over runs; [preset] marks runs that are not the '
    'reference configuration.',
    '',
    head,
    '|' + '---|' * (len(TASK_COLUMNS) + 2),
  ]
  for model in models:
    ours = {
      t: float(np.mean(runs[(t, model)]))
      for t in TASK_COLUMNS
      if (t, model) in runs
    }
    cells = []
    for t in TASK_COLUMNS + ('avg',):
      value = lra_average(ours) if t == 'avg' else ours.get(t)
      cell = '-' if value is None else f'{value:.2f}'
      if t != 'avg' and len(runs.get((t, model), [])) > 1:
        cell += f' ±{np.std(runs[(t, model)]):.2f}'
      ref = table1.get(model.split(' [')[0], [None] * len(cols))
      ref = ref[cols.index(t)]
      cells.append(cell + (f' ({ref:.2f})' if ref is not None else ''))
    lines.append(f'| {model} | ' + ' | '.join(cells) + ' |')
  return '\n'.join(lines)


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
  """The bubble chart's data: models both trained and benchmarked.

  Accuracy is the LRA average when every such model has the five tasks;
  otherwise the mean over the tasks they all have; otherwise each model's
  mean over its own tasks. Speed is steps/s at the longest length at which
  'transformer' ran, relative to it (without a transformer row: absolute, at
  the longest length measured).

  Returns:
    (points, length, relative, accuracy_label); points are (model, accuracy
    %, speed, peak memory bytes, tasks).
  """
  runs = collect_runs(runs_dir)
  rows = [r for r in read_benchmark(bench_dir) if r['status'] == 'ok']
  base = {r['length']: r for r in rows if r['model'] == 'transformer'}
  lengths = set(base) or {r['length'] for r in rows}
  if not lengths:
    raise UserError(
      f'{bench_dir}/benchmark.json has no successful cell; rerun benchmark.py.'
    )
  length = max(lengths)
  relative = length in base
  scores = {}
  for (task, model), values in runs.items():
    scores.setdefault(model, {})[task] = float(np.mean(values))
  rows = [r for r in rows if r['length'] == length and r['model'] in scores]
  if not rows:
    raise UserError(
      f'No model is both in the runs below {runs_dir} and measured at '
      f'{length} in {bench_dir}; benchmark the models you trained.'
    )
  common = set.intersection(*(set(scores[r['model']]) for r in rows))
  if all(lra_average(scores[r['model']]) is not None for r in rows):
    label, tasks = 'LRA average test accuracy (%)', TASK_COLUMNS[:5]
  elif common:
    tasks = [t for t in TASK_COLUMNS if t in common]
    label = f'test accuracy (%), mean over {", ".join(tasks)}'
  else:
    label, tasks = "test accuracy (%), mean over each model's tasks", None
  points = []
  for r in rows:
    own = scores[r['model']]
    used = sorted(own) if tasks is None else tasks
    speed = r['steps_per_sec']
    if relative:
      speed /= base[length]['steps_per_sec']
    accuracy = float(np.mean([own[t] for t in used]))
    points.append(
      (r['model'], accuracy, speed, r['peak_memory_bytes'], tuple(used))
    )
  return points, length, relative, label


def bubble_chart(runs_dir, bench_dir):
  """LRA's Figure 3: accuracy against speed, circle area = peak memory.

  One circle per model from the results.json files below runs_dir and
  bench_dir/benchmark.json (see bubble_points). Writes and returns
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
  ax.set_title(
    f'circle area = peak memory at {length} (XLA memory analysis); '
    f'largest {largest / 1e9:.3g} GB',
    fontsize=9,
  )
  ax.grid(True, alpha=0.3)
  fig.tight_layout()
  path = os.path.join(bench_dir, 'lra_bubble.png')
  fig.savefig(path, dpi=120)
  plt.close(fig)
  return path
