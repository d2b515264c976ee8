"""Loss and accuracy against step of one or many runs, from metrics.jsonl.

`python eval.py --plot RUN_OR_RUNS_DIR[,...]` writes `curves_loss.png` and
`curves_accuracy.png`: one panel per split (train, val), one line per run,
labelled with the run's folder. Training curves are noisy: each is drawn as
its exponential moving average (lra/report/plotstyle.py ema, the weight in the
panel's title) over its raw points, faint; validation points are drawn as
logged. Colours are tab10; with more than 8 runs each also gets its own
line style and marker. Runs of an LM objective (lra/train/objectives.py)
log token_accuracy instead of accuracy, and causal_lm runs a validation
perplexity: then `curves_token_accuracy.png` and `curves_perplexity.png`
are written too (a causal_lm run's train perplexity is exp of its logged
train loss), and `curves_accuracy.png` only when some run has an accuracy.
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


def series(runs):
  """{(metric, split): {label: (steps, values)}} of the runs' rows; the
  label is the run's folder relative to the runs' common parent."""
  if len(runs) == 1:
    labels = [os.path.basename(os.path.abspath(runs[0]))]
  else:
    parent = os.path.commonpath([os.path.abspath(r) for r in runs])
    labels = [os.path.relpath(os.path.abspath(r), parent) for r in runs]
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


def _objective(run):
  """The run's config.json objective ('classify' when it has none)."""
  try:
    with open(os.path.join(run, 'config.json')) as f:
      return json.load(f).get('objective', 'classify')
  except (OSError, ValueError, AttributeError):
    return 'classify'


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
  """The figure of one metric (module docstring): a panel per split, a
  style per run (plotstyle.series_styles, the same run alike in every
  figure), training curves smoothed over their faint raw points; past
  plotstyle.MANY_SERIES runs the legend stands beside the panels."""
  import matplotlib  # pylint: disable=g-import-not-at-top

  matplotlib.use('Agg')
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top

  labels = list(dict.fromkeys(k for lines in data.values() for k in lines))
  styles = plotstyle.series_styles(labels)
  fig, axes = plt.subplots(1, len(SPLITS), figsize=(11, 4), squeeze=False)
  for ax, split in zip(axes[0], SPLITS):
    lines = data[metric, split]
    # One smoothing weight per panel, from its longest curve.
    weight = plotstyle.auto_weight(
      max((len(v) for _, v in lines.values()), default=0)
    )
    for label, (steps, values) in lines.items():
      style = dict(styles[label])
      if split != 'train':  # evaluations: few points, drawn as logged
        style['marker'] = style['marker'] or '.'
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
    title = f'{split} {metric}'
    if split == 'train' and weight:
      title += f' (EMA {weight:.2g}; faint: as logged)'
    ax.set_title(title)
    ax.set_xlabel('step')
    ax.grid(True, alpha=0.3)
    if lines and len(labels) <= plotstyle.MANY_SERIES:
      ax.legend(fontsize=7)
  if len(labels) > plotstyle.MANY_SERIES:
    handles = [plt.Line2D([], [], label=k, **styles[k]) for k in labels]
    fig.legend(
      handles=handles,
      fontsize=7,
      loc='center left',
      bbox_to_anchor=(1.0, 0.5),
      frameon=False,
    )
  fig.tight_layout()
  return fig
