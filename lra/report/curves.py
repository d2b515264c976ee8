"""Loss and accuracy against step of one or many runs, from metrics.jsonl.

`lra-eval --plot RUN_OR_RUNS_DIR[,...]` (python eval.py --plot) writes
`curves_loss.png` and `curves_accuracy.png`: one panel per split (train,
val), one line per run, labelled with the run's model (config.json
model_name; with its folder when two runs share a model, the folder alone
for a run without config.json).
Each model is drawn in its own colour, marker and line style, the same in
every figure of the project (lra/report/plotstyle.py); past
plotstyle.MAX_PER_PANEL runs, a row of panels per family of models.
Accuracies are drawn in percent, as the docs and the tables give them.
Training curves are noisy: each is drawn as its exponential moving average
(plotstyle.ema, the weight in the panel's title) over its raw points, faint;
validation points are drawn as logged. Runs of an LM objective
(lra/train/objectives.py) log token_accuracy instead of accuracy, and
causal_lm runs a validation perplexity: then `curves_token_accuracy.png`
and `curves_perplexity.png` are written too (a causal_lm run's train
perplexity is exp of its logged train loss), and `curves_accuracy.png` only
when some run has an accuracy.
TensorBoard is not needed (its scalars are written too when a writer is
installed: lra/train/metrics.py).
"""

import json
import math
import os

from lra.errors import UserError
from lra.report import plotstyle
from lra.train.metrics import read_rows

METRICS = ('loss', 'accuracy', 'token_accuracy', 'perplexity')
SPLITS = ('train', 'val')
NAMES = {m: f'curves_{m}.png' for m in METRICS}
# The y axis of each metric, and the factor its logged value is drawn at.
YLABELS = {
  'loss': 'loss (cross-entropy, nats)',
  'accuracy': 'accuracy (%)',
  'token_accuracy': 'token accuracy (%)',
  'perplexity': 'perplexity',
}
SCALE = {'accuracy': 100.0, 'token_accuracy': 100.0}


def find_runs(paths):
  """Run folders (with a metrics.jsonl) given or below the given paths."""
  runs = []
  for path in paths:
    if not os.path.isdir(path):
      raise UserError(f'--plot {path}: no such folder; give run folders.')
    found = sorted(
      root
      for root, _, files in os.walk(path)
      if 'metrics.jsonl' in files and '/checkpoints' not in root
    )
    if not found:
      raise UserError(
        f'--plot {path}: no metrics.jsonl in it or below it; give the '
        '--workdir of a run started by train.py.'
      )
    runs += [r for r in found if r not in runs]
  return runs


def _folders(runs):
  """Each run's folder relative to the runs' common parent."""
  if len(runs) == 1:
    return [os.path.basename(os.path.abspath(runs[0]))]
  parent = os.path.commonpath([os.path.abspath(r) for r in runs])
  return [os.path.relpath(os.path.abspath(r), parent) for r in runs]


def run_labels(runs):
  """Each run's label: its model (config.json model_name); `model
  (folder)` when two runs share the model; the folder alone when the run
  has no readable config.json."""
  models = [_config(run).get('model_name') for run in runs]
  counts = {m: models.count(m) for m in models}
  return [
    folder if not model else model if counts[model] == 1
    else f'{model} ({folder})'
    for model, folder in zip(models, _folders(runs))
  ]  # fmt: skip


def series(runs):
  """{(metric, split): {label: (steps, values)}} of the runs' rows as
  logged (fractions; the figure draws percent), labelled by run_labels."""
  labels = run_labels(runs)
  out = {(m, s): {} for m in METRICS for s in SPLITS}
  for run, label in zip(runs, labels):
    rows = read_rows(os.path.join(run, 'metrics.jsonl'))
    if _objective(run) == 'causal_lm':
      rows = [
        dict(r, perplexity=math.exp(min(r['loss'], 700.0)))
        if r.get('split') == 'train' and 'loss' in r
        else r
        for r in rows
      ]
    for (metric, split), lines in out.items():
      points = [
        (r['step'], r[metric])
        for r in rows
        if r.get('split') == split and r.get(metric) is not None
      ]
      if points:
        steps, values = zip(*points)
        lines[label] = (list(steps), list(values))
  return out


def _config(run):
  """The run's config.json as a dict ({} when it is missing or unreadable)."""
  try:
    with open(os.path.join(run, 'config.json')) as f:
      config = json.load(f)
  except (OSError, ValueError):
    return {}
  return config if isinstance(config, dict) else {}


def _objective(run):
  """The run's config.json objective ('classify' when it has none)."""
  return _config(run).get('objective', 'classify')


def drawn(data):
  """The metrics plotted: loss; accuracy unless only LM runs have a token
  accuracy; token_accuracy and perplexity when some run logged them."""
  has = {m: any(data[m, s] for s in SPLITS) for m in METRICS}
  keep = {
    'loss': True,
    'accuracy': has['accuracy'] or not has['token_accuracy'],
    'token_accuracy': has['token_accuracy'],
    'perplexity': has['perplexity'],
  }
  return [m for m in METRICS if keep[m]]


def plot(paths, out_dir=None):
  """Writes the PNGs (`drawn`) into out_dir (default: the first path);
  returns ([png paths], series)."""
  import matplotlib  # pylint: disable=g-import-not-at-top

  matplotlib.use('Agg')
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top

  runs = find_runs(paths)
  data = series(runs)
  out_dir = out_dir or paths[0]
  os.makedirs(out_dir, exist_ok=True)
  written = []
  for metric in drawn(data):
    fig = figure(data, metric)
    path = os.path.join(out_dir, NAMES[metric])
    fig.savefig(path, dpi=110, bbox_inches='tight')
    plt.close(fig)
    written.append(path)
  return written, data


def figure(data, metric):
  """The figure of one metric (module docstring): a column per split, a
  style per run's model (plotstyle.series_styles: the same model alike in
  every figure), training curves smoothed over their faint raw points;
  past plotstyle.MAX_PER_PANEL runs a row of panels per family
  (plotstyle.panels); past plotstyle.MANY_SERIES runs in a row, its legend
  beside its panels."""
  import matplotlib  # pylint: disable=g-import-not-at-top

  matplotlib.use('Agg')
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top

  labels = list(dict.fromkeys(k for lines in data.values() for k in lines))
  styles = plotstyle.series_styles(labels)
  groups = plotstyle.panels(labels)
  scale = SCALE.get(metric, 1.0)
  fig, axes = plt.subplots(
    len(groups),
    len(SPLITS),
    figsize=(11, 4 * len(groups)),
    squeeze=False,
  )
  for row, (family, group) in zip(axes, groups):
    for ax, split in zip(row, SPLITS):
      lines = {k: v for k, v in data[metric, split].items() if k in group}
      _draw_panel(ax, lines, split, styles, scale)
      title = f'{split} {metric}'
      weight = _weight(lines) if split == 'train' else 0
      if weight:
        title += f' (EMA {weight:.2g}; faint: as logged)'
      ax.set_title(f'{title}: {family}' if family else title)
      ax.set_xlabel('training step')
      ax.set_ylabel(YLABELS[metric])
      ax.grid(True, alpha=0.3)
      if lines and len(group) <= plotstyle.MANY_SERIES:
        ax.legend(fontsize=7)
    if len(group) > plotstyle.MANY_SERIES:
      handles = [plt.Line2D([], [], label=k, **styles[k]) for k in group]
      row[-1].legend(
        handles=handles,
        fontsize=7,
        loc='center left',
        bbox_to_anchor=(1.02, 0.5),
        frameon=False,
      )
  fig.tight_layout()
  return fig


def _weight(lines):
  """One smoothing weight per panel, from its longest curve."""
  return plotstyle.auto_weight(
    max((len(v) for _, v in lines.values()), default=0)
  )


def _draw_panel(ax, lines, split, styles, scale):
  """One panel's curves: evaluations as logged, training curves as their
  EMA over the faint raw points; values times `scale` (percent)."""
  weight = _weight(lines) if split == 'train' else 0
  for label, (steps, values) in lines.items():
    values = [scale * v for v in values]
    style = dict(styles[label])
    if split != 'train':  # evaluations: few points, drawn as logged
      ax.plot(steps, values, label=label, **style)
      continue
    if weight:  # the raw points, faint, behind the average
      ax.plot(
        steps,
        values,
        color=style['color'],
        alpha=0.25,
        lw=0.8,
        zorder=1,
        gid='raw',
      )
    ax.plot(
      steps,
      plotstyle.ema(values, weight),
      label=label,
      zorder=2,
      markevery=max(1, len(steps) // 12),
      gid='smoothed' if weight else None,
      **style,
    )
