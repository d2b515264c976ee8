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


def collect_runs(runs_dir):
  """{(task, model): [test accuracy %, ...]} from every results.json below."""
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
    runs.setdefault((r['task'], r['model']), []).append(
      100.0 * r['test']['accuracy']
    )
  return runs


def lra_average(scores):
  """The LRA average: mean over the five tasks without Path-X, or None."""
  vals = [scores.get(t) for t in TASK_COLUMNS[:5]]
  return None if any(v is None for v in vals) else float(np.mean(vals))


def accuracy_table(runs_dir):
  runs = collect_runs(runs_dir)
  table1 = paper()['table1_accuracy']
  cols = table1['columns']
  models = sorted({m for _, m in runs}, key=lambda m: (m not in table1, m))
  head = '| model | ' + ' | '.join(TASK_COLUMNS) + ' | avg |'
  lines = [
    "Test accuracy (%): ours, with the LRA paper's in brackets; "
    '"±" is the spread over runs.',
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
      ref = table1.get(model, [None] * len(cols))[cols.index(t)]
      cells.append(cell + (f' ({ref:.2f})' if ref is not None else ''))
    lines.append(f'| {model} | ' + ' | '.join(cells) + ' |')
  return '\n'.join(lines)
