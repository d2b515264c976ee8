"""LRA's Figure 3, the bubble chart: accuracy against speed, circle area =
peak memory. It joins a benchmark (benchmark.py --out DIR: its
benchmark.json, lra/bench/) with the trained runs' accuracy table
(lra/report/tables.py); `eval.py --table RUNS --bench DIR` draws it. It
reads the benchmark's JSON file and imports nothing of lra/bench, whose
report names its machine with `setup` from here.
"""

from __future__ import annotations

import json
import os

import numpy as np

from lra import commands
from lra.errors import UserError
from lra.report import plotstyle
from lra.report import tables as report
from lra.report.paper import TASK_COLUMNS, lra_average


def setup(row):
  """'2 x cpu (cpu backend), preset cpu, batch 2 (1 per device)'."""
  n = row['device_count'] or 1
  batch = row['batch_size']  # None when the cell failed before its config
  per_device = '' if batch is None else f' ({batch / n:g} per device)'
  return (
    f'{n} x {row["device_kind"]} ({row["backend"]} backend), preset '
    f'{row["preset"]}, batch {batch}{per_device}'
  )


def read_benchmark(bench_dir: str) -> list[dict]:
  """The rows of bench_dir/benchmark.json, written by benchmark.py."""
  path = os.path.join(bench_dir, 'benchmark.json')
  if not os.path.exists(path):
    raise UserError(
      f'No benchmark.json in {bench_dir}; run '
      f'`{commands.command("benchmark", "--out", str(bench_dir))}` first.'
    )
  with open(path) as f:
    return json.load(f)


def bubble_points(runs_dir: str, bench_dir: str) -> tuple:
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
  groups = report.group_runs(report.read_runs(runs_dir))
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


def bubble_chart(runs_dir: str, bench_dir: str) -> str:
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
  fig = bubble_figure(
    points, length, relative, label, setup(read_benchmark(bench_dir)[0])
  )
  path = os.path.join(bench_dir, 'lra_bubble.png')
  fig.savefig(path, dpi=120)
  plt.close(fig)
  return path


def bubble_figure(points, length, relative, label, machine):
  """The bubble chart's figure (bubble_chart): each circle in its model's
  colour, its centre in its marker (lra/report/plotstyle.py, as in every
  figure);
  each label starts just above its circle and the labels are moved apart
  until none overlaps another (plotstyle.repel_labels, measured by the
  renderer), with a leader line from a moved label to its circle's
  centre."""
  import matplotlib  # pylint: disable=g-import-not-at-top

  matplotlib.use('Agg')
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top

  largest = max(p[3] for p in points)
  own_tasks = len({p[4] for p in points}) > 1
  styles = plotstyle.series_styles([p[0] for p in points])
  area = [2500 * p[3] / largest for p in points]  # points^2
  fig, ax = plt.subplots(figsize=(7.5, 5.5))
  for i, (name, accuracy, speed, _, _) in enumerate(points):
    color = styles[name]['color']
    ax.scatter(
      speed,
      accuracy,
      s=area[i],
      alpha=0.35,
      color=color,
      edgecolors=color,
      linewidths=1.0,
    )
    ax.plot(
      speed,
      accuracy,
      styles[name]['marker'],
      color=color,
      markersize=4,
      label=name,
    )
  ax.margins(0.25)
  ax.set_xlabel(
    f'speed at length {length}: steps/s '
    + ('relative to transformer' if relative else '(absolute)')
  )
  ax.set_ylabel(label)
  ax.set_title(
    f'circle area = peak memory at {length} (XLA memory analysis); '
    f'largest {largest / 1e9:.3g} GB\n{machine}',
    fontsize=9,
  )
  ax.grid(True, alpha=0.3)
  fig.tight_layout()
  ax.set_autoscale_on(False)  # the labels move in the final frame
  texts = []
  for (model, accuracy, speed, _, tasks), a in zip(points, area):
    name = f'{model} ({", ".join(tasks)})' if own_tasks else model
    color = styles[model]['color']
    texts.append(
      ax.annotate(
        name,
        (speed, accuracy),
        xytext=(0, np.sqrt(a / np.pi) + 1),  # just above the circle
        textcoords='offset points',
        ha='center',
        va='bottom',
        fontsize=8,
        color=plotstyle.darker(color),
        bbox=dict(boxstyle='round,pad=0.15', fc='white', ec='none', alpha=0.7),
        arrowprops=dict(
          arrowstyle='-', color=color, lw=0.9, shrinkA=0, shrinkB=1
        ),
      )
    )
  plotstyle.repel_labels(ax, texts, avoid=[(p[2], p[1]) for p in points])
  return fig
