r"""The MQAR comparison from sweeps: a table and a plot in Zoology's style.

  python -m experiments.mqar.report --sweeps runs/mqar64,runs/mqar32 --out experiments/mqar

reads each sweep folder's sweep.json (python -m lra.sweep --tasks mqar
..., with or without --grid) and writes into --out:

  mqar.md    one row per (model, data form, width): the learning rate (or
             other grid combination) chosen on validation (sweep_grid.py:
             best validation accuracy), how many grid runs finished (the
             choice is among those), and the test accuracy of that run
             at each number of key-value pairs at the training length, then
             at the other extra test splits; a point whose runs have not all
             finished, or that has fewer grid combinations than the sweep's
             largest point (a sweep run in pieces), is marked partial;
  mqar.png   accuracy against the number of pairs at the training length
             (log2 axis), one line per model, one panel per width (Zoology,
             arXiv 2312.04927, plots recall against width and pairs).

The x axis joins the run's own test split (its data.seq_len and
data.num_kv_pairs) with its extra test splits of the same length
(data.test_splits entries `seq_len:pairs`); splits at other lengths are
table columns only. Width is the run's model.emb_dim; the form is its
data.form (bidirectional rows, for encoders that cannot be causal, are
marked `bi`). A (model, form, width) found in two sweeps is an error (one
sentence): give each comparison once, or name a sweep: `LABEL=FOLDER` in
--sweeps shows that sweep's rows as LABEL (e.g. `mamba, Zoology
block=runs/mqar/mamba_zoo`), so one model in two set-ups is two rows;
`LABEL=FOLDER@KEY=VALUE` takes the runs of one grid setting of a sweep
(`h3, head_dim 8=runs/mqar/h3_long@model.attention.head_dim=8`), so an
option compared rather than tuned is one row per value.

A run stopped before its last step (interrupted: no test accuracy) is not
a table row; its validation curve is still drawn in mqar_curves.png,
labelled with the step it reached, and mqar.md lists it under "Stopped
before the end" with its best validation accuracy.
"""

from __future__ import annotations

import os
import sys

from absl import app, flags

from lra.errors import UserError
from lra.sweep import archive as sweep_archive
from lra.sweep import grid as sweep_grid
from lra.train import cli, rundir
from lra.train.metrics import read_rows

FLAGS = flags.FLAGS


def _percent(x):
  return '-' if x is None else f'{100 * x:.1f}'


def _split_shape(name):
  length, pairs = name.split(':')
  return int(length), int(pairs)


# The grid key of the width axis (Zoology's Figure 2 x axis).
WIDTH = 'model.emb_dim'


def tuned_per_width(entries: list[dict]) -> list[dict]:
  """sweep_grid.tuned_rows, once per value of the width grid (each width
  tuned over the rest of the grid, as Zoology picks the best learning rate
  at each point of its width curves); one pass without that grid key."""
  widths = {}
  for e in entries:
    widths.setdefault(e['grid'].get(WIDTH), []).append(e)
  rows = [
    row for group in widths.values() for row in sweep_grid.tuned_rows(group)
  ]
  # A sweep run in pieces (one `--grid` call per width or per few rates)
  # lists at some points fewer rates than at others: such a point is not
  # complete until it has every combination the largest point was given.
  largest = max((len(_combinations(r['runs'])) for r in rows), default=0)
  return [
    dict(r, complete=r['complete'] and len(_combinations(r['runs'])) >= largest)
    for r in rows
  ]


def _combinations(runs: list[dict]) -> set:
  """The grid combinations (width aside) among a point's runs."""
  return {
    tuple(sorted((k, str(v)) for k, v in r['grid'].items() if k != WIDTH))
    for r in runs
  }


def _rates(runs: list[dict]) -> tuple[str, ...]:
  """The learning rates of a point's grid (as the --grid gave them),
  lowest first; () when the grid has no learning_rate."""
  grids = [r.get('grid') or {} for r in runs]
  rates = {str(g['learning_rate']) for g in grids if 'learning_rate' in g}
  return tuple(sorted(rates, key=float))


def named_sweep(item: str) -> tuple[str | None, str]:
  """'LABEL=FOLDER' -> (LABEL, FOLDER); a plain folder -> (None, FOLDER)."""
  label, sep, folder = item.partition('=')
  if sep and label.strip() and '/' not in label and folder:
    return label.strip(), folder
  return None, item


def _entries(item: str) -> tuple[str | None, str, list[dict]]:
  """A --sweeps item's label, folder and mqar runs. 'FOLDER@KEY=VALUE'
  keeps the runs whose grid sets KEY to VALUE (several: '@K=V@K2=V2'),
  so one grid axis (an option compared, not tuned) gives one row each:
  'h3 d1=runs/h3@model.attention.head_dim=1'."""
  label, folder = named_sweep(item)
  folder, *filters = folder.split('@')
  wanted = {}
  for f in filters:
    key, sep, value = f.partition('=')
    if not sep or not key:
      raise UserError(
        f'--sweeps {item}: after @ comes KEY=VALUE, a grid setting of the '
        'sweep (e.g. @model.attention.head_dim=8).'
      )
    wanted[key] = value
  sweep = rundir.read_json(os.path.join(folder, 'sweep.json'))
  if not isinstance(sweep, dict):
    raise UserError(
      f'--sweeps {folder}: no sweep.json in it; give the --out folder of '
      'a finished python -m lra.sweep --tasks mqar run.'
    )
  entries = [
    dict(
      e,
      grid=e.get('grid') or {},
      workdir=sweep_archive.resolve(folder, e.get('workdir')),
    )
    for e in sweep.get('runs', [])
    if e.get('task') == 'mqar'
    and all(str((e.get('grid') or {}).get(k)) == v for k, v in wanted.items())
  ]
  if wanted and not entries:
    raise UserError(
      f'--sweeps {item}: no run of {folder} has the grid setting '
      f'{", ".join(f"{k}={v}" for k, v in wanted.items())}.'
    )
  return label, folder, entries


def val_points(workdir: str) -> list[tuple]:
  """[(step, validation accuracy %)] of a run's metrics.jsonl ([] if none)."""
  log = os.path.join(workdir, 'metrics.jsonl')
  if not os.path.exists(log):
    return []
  return [
    (r['step'], 100 * r['accuracy'])
    for r in read_rows(log)
    if r.get('split') == 'val' and 'accuracy' in r
  ]


# A chosen run still rising: its last validation accuracy above every
# earlier one by more than this many points.
RISING_POINTS = 1.0


def still_rising(vals: list[tuple]) -> bool:
  """Whether a validation curve [(step, %)] was still rising when training
  ended: its last point more than RISING_POINTS above every earlier one."""
  if len(vals) < 2:
    return False
  return vals[-1][1] > max(v for _, v in vals[:-1]) + RISING_POINTS


def _setting(model: str, label: str | None, config: dict) -> dict:
  """The fields every row shares: model, name, core (the registered
  attention core or mixer), form, width, seq_len, pairs."""
  data, net = config.get('data', {}), config.get('model', {})
  return dict(
    model=model,
    name=label or model,
    core=(net.get('attention') or {}).get('name', model),
    form=data.get('form'),
    width=net.get('emb_dim'),
    seq_len=data.get('seq_len'),
    pairs=data.get('num_kv_pairs'),
  )


def stopped_of(sweep_dirs: list[str]) -> list[dict]:
  """The sweeps' mqar runs stopped before their last step that logged a
  validation point: name, width, seq_len, pairs, workdir, steps_done,
  num_train_steps, best_val (%), the step of that best, test (%, of the
  best checkpoint when `python eval.py --workdir W --split test` evaluated
  it: W/eval_test_best.json; else None)."""
  out = []
  for item in sweep_dirs:
    label, _, entries = _entries(item)
    for e in entries:
      if e.get('status') != 'interrupted' or not e.get('workdir'):
        continue
      vals = val_points(e['workdir'])
      if not vals:
        continue
      config = rundir.read_config(e['workdir']) or {}
      step, best = max(vals, key=lambda v: v[1])
      out.append(
        dict(
          **_setting(e['model'], label, config),
          workdir=e['workdir'],
          steps_done=e.get('steps_done') or vals[-1][0],
          num_train_steps=e.get('num_train_steps'),
          best_val=best,
          best_step=step,
          choice=sweep_grid.label(tuple(e['grid'].items())),
          test=_evaluated_test(e['workdir']),
        )
      )
  return out


def _evaluated_test(workdir):
  """Test accuracy (%) of eval.py's evaluation of the run's best
  checkpoint (workdir/eval_test_best.json), or None."""
  path = os.path.join(workdir, 'eval_test_best.json')
  accuracy = (rundir.load_json(path) or {}).get('accuracy')
  if accuracy is not None and not isinstance(accuracy, (int, float)):
    raise UserError(f'{path} holds accuracy {accuracy!r}, not a number.')
  return None if accuracy is None else 100 * accuracy


def stopped_markdown(stopped: list[dict]) -> str:
  if not stopped:
    return ''
  lines = [
    'Stopped before the end (validation; test where `python eval.py '
    '--workdir W --split test` evaluated the best checkpoint):',
    '',
    '| run | width | L:pairs | grid | reached step | best validation (%) '
    '| test at that checkpoint (%) |',
    '|---|---|---|---|---|---|---|',
  ]
  for r in stopped:
    test = r.get('test')
    lines.append(
      f'| `{_label(r)}` | {r["width"]} | {r["seq_len"]}:{r["pairs"]} | '
      f'{r["choice"] or "-"} | {r["steps_done"]:,} of '
      f'{r["num_train_steps"] or 0:,} | {r["best_val"]:.1f} (step '
      f'{r["best_step"]:,}) | {"-" if test is None else f"{test:.1f}"} |'
    )
  return '\n'.join(lines) + '\n'


def rows_of(sweep_dirs: list[str]) -> list[dict]:
  """One dict per (model, form, width) of the sweeps' mqar runs (tuned by
  the grid when there is one): model, name (the sweep's LABEL, else the
  model), form, width, choice, complete, seq_len, curve {pairs: accuracy},
  splits {name: accuracy}."""
  rows, seen = [], {}
  for item in sweep_dirs:
    label, folder, entries = _entries(item)
    for tuned in tuned_per_width(entries):
      best = tuned['best']
      if best is None:
        continue
      config = rundir.read_config(best['workdir']) or {}
      shape = _setting(tuned['model'], label, config)
      key = tuple(
        shape[k] for k in ('name', 'form', 'width', 'seq_len', 'pairs')
      )
      if key in seen:
        raise UserError(
          f'{key[0]} ({key[1]}, width {key[2]}, {key[3]}:{key[4]}) is in '
          f'both {seen[key]} and {folder}; give each comparison once in '
          '--sweeps, or name one: LABEL=FOLDER.'
        )
      seen[key] = folder
      length, pairs = shape['seq_len'], shape['pairs']
      splits = {
        name: acc
        for name, acc in (best.get('test_splits') or {}).items()
        if acc is not None
      }
      curve = {pairs: best.get('test_accuracy')}
      for name, acc in splits.items():
        at_length, at_pairs = _split_shape(name)
        if at_length == length:
          curve[at_pairs] = acc
      rows.append(
        dict(
          **shape,
          choice=sweep_grid.label(
            tuple((k, v) for k, v in best['grid'].items() if k != WIDTH)
          ),
          learning_rate=(config.get('learning_rate')),
          rates=_rates(tuned['runs']),
          workdir=best['workdir'],
          complete=tuned['complete'],
          diverged=tuned['diverged'],
          finished=sum(
            e.get('status') in ('done', 'skipped') for e in tuned['runs']
          ),
          seeds=best.get('seed_count', 1),
          test_range=best.get('test_range'),
          curve=dict(sorted(curve.items())),
          splits=splits,
          rising=still_rising(val_points(best['workdir'])),
        )
      )
  if not rows:
    raise UserError(
      f'--sweeps {",".join(sweep_dirs)}: no finished mqar run in them; run '
      'python -m lra.sweep --tasks mqar ... first.'
    )
  return sorted(
    rows,
    key=lambda r: (
      r['seq_len'] or 0,
      r['pairs'] or 0,
      r['width'] or 0,
      r['form'] or '',
    ),
  )


def markdown(rows: list[dict]) -> str:
  pairs = sorted({p for r in rows for p in r['curve']})
  others = sorted(
    {
      n for r in rows for n in r['splits'] if _split_shape(n)[0] != r['seq_len']
    },
    key=_split_shape,
  )
  length = sorted({r['seq_len'] for r in rows})
  at = '/'.join(str(n) for n in length)
  head = ['model', 'form', 'width', 'chosen on val', 'runs']
  head += [f'{p} pairs (L={at})' for p in pairs]
  head += [f'L:pairs {n}' for n in others]
  lines = ['| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
  for r in rows:
    choice = r['choice'] or '-'
    if not r['complete']:
      choice += ' (partial)'
    cells = [
      f'`{r.get("name") or r["model"]}`',
      'bi' if r['form'] == 'bidirectional' else r['form'] or '-',
      str(r['width']),
      choice,
      str(r['finished']),
      *(_percent(r['curve'].get(p)) for p in pairs),
      *(_percent(r['splits'].get(n)) for n in others),
    ]
    lines.append('| ' + ' | '.join(cells) + ' |')
  return '\n'.join(lines)


def plot(rows: list[dict], path: str) -> None:
  """Accuracy against the number of pairs at the training length (the
  first training setting's rows), one panel per width, one line per model."""
  import matplotlib  # pylint: disable=g-import-not-at-top

  matplotlib.use('Agg')
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top

  first = settings_of(rows)[0]
  rows = [r for r in rows if (r['seq_len'], r['pairs']) == first]
  widths = sorted({r['width'] for r in rows})
  names = list(dict.fromkeys(_label(r) for r in rows))
  style = _styles(names, _models(rows))
  families = _families(rows, names)
  fig, axes = plt.subplots(
    len(families), len(widths),
    figsize=(5.5 * len(widths) + 2.5, 4.5 * len(families)), squeeze=False,
  )  # fmt: skip
  for row_axes, (family, group) in zip(axes, families):
    for ax, width in zip(row_axes, widths):
      for r in rows:
        if r['width'] != width or not r['curve'] or _label(r) not in group:
          continue
        xs = list(r['curve'])
        ys = [100 * (r['curve'][x] or 0.0) for x in xs]
        colour, marker, line = style[_label(r)]
        ax.plot(
          xs, ys, marker=marker, color=colour, linestyle=line,
          label=_label(r),
        )  # fmt: skip
      ax.set_xscale('log', base=2)
      pairs = sorted({p for r in rows for p in r['curve']})
      ax.set_xticks(pairs, [str(p) for p in pairs])
      ax.minorticks_off()
      _label_panel(
        ax, f'key-value pairs (length {first[0]})', 'test accuracy (%)',
        f'MQAR, width {width}', family,
      )  # fmt: skip
      if not ax.lines:  # no model of this family ran at this width
        ax.cla()
        ax.axis('off')
        ax.text(
          0.5, 0.5, f'no {family or "model"} at width {width}',
          ha='center', va='center', transform=ax.transAxes, color='0.4',
        )  # fmt: skip
    handles, labels = _shared_legend(row_axes)
    row_axes[-1].legend(
      handles, labels, loc='center left', bbox_to_anchor=(1.02, 0.5),
      fontsize=9,
    )  # fmt: skip
  fig.tight_layout()
  fig.savefig(path, dpi=110, bbox_inches='tight')
  plt.close(fig)


def settings_of(rows):
  """The (seq_len, pairs) training settings of the rows, sorted."""
  return sorted({(r['seq_len'], r['pairs']) for r in rows})


def width_markdown(rows: list[dict]) -> str:
  """Per training setting, one row per model: the test accuracy at the
  training shape at each width, with the learning rate chosen there on
  validation; `*` marks a point whose grid has not all finished, `~` one
  where a rate diverged (the best of the others), `^` one
  whose chosen run was still rising when it ended (still_rising); with a
  seed grid (--grid seed=0,1) the mean over seeds, their range in
  brackets."""
  out = []
  for length, pairs in settings_of(rows):
    at = [r for r in rows if (r['seq_len'], r['pairs']) == (length, pairs)]
    widths = sorted({r['width'] for r in at})
    rates = sorted({x for r in at for x in r.get('rates', ())}, key=float)
    among = f' among {", ".join(rates)}' if rates else ''
    out.append(
      f'Length {length}, {pairs} key-value pairs: test accuracy (%)'
      f' at each width (learning rate chosen on validation{among}).\n'
    )
    head = ['model'] + [f'width {w}' for w in widths]
    out += ['| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
    for name in dict.fromkeys(_label(r) for r in at):
      cells = [f'`{name}`']
      for w in widths:
        r = next((r for r in at if _label(r) == name and r['width'] == w), None)
        if r is None:
          cells.append('-')
          continue
        lr = r['learning_rate']
        cell = (
          f'{_percent(r["curve"].get(pairs))} ({lr:g})'
          if lr
          else _percent(r['curve'].get(pairs))
        )
        if r.get('seeds', 1) > 1 and r.get('test_range'):
          low, high = r['test_range']
          cell += f' [{100 * low:.1f}-{100 * high:.1f}, {r["seeds"]} seeds]'
        cell += '' if r['complete'] else '*'
        cell += '~' if r.get('diverged') else ''
        cells.append(cell + ('^' if r.get('rising') else ''))
      out.append('| ' + ' | '.join(cells) + ' |')
    marks = [
      '`*` grid unfinished (the best of the rates run so far)'
      if any(not r['complete'] for r in at)
      else '',
      '`~` a rate of the grid diverged (non-finite gradient; the best of '
      'the others)'
      if any(r.get('diverged') for r in at)
      else '',
      f'`^` validation still rising at the last evaluation (more than '
      f'{RISING_POINTS:g} point above every earlier one): the budget set '
      'this point'
      if any(r.get('rising') for r in at)
      else '',
    ]
    if any(marks):
      out += ['', '; '.join(m for m in marks if m) + '.']
    edges = grid_edges(at)
    if edges:
      out += ['', edges]
    out.append('')
  return '\n'.join(out)


def grid_edges(at: list[dict]) -> str:
  """One sentence: how many complete points chose the highest (lowest)
  learning rate of their grid, where a better rate may lie beyond it (''
  when none, or the grid has fewer than two rates)."""
  top = bottom = n = 0
  for r in at:
    rates = [float(x) for x in r.get('rates', ())]
    if len(rates) < 2 or not r.get('learning_rate') or not r['complete']:
      continue
    n += 1
    top += r['learning_rate'] == max(rates)
    bottom += r['learning_rate'] == min(rates)
  if not top and not bottom:
    return ''
  parts = [
    f'{count} of {n} points chose the {which} rate of their grid'
    for count, which in ((top, 'highest'), (bottom, 'lowest'))
    if count
  ]
  return ' and '.join(parts) + ': a better rate may lie beyond the grid there.'


def _label(r):
  name = r.get('name') or r['model']
  return name + (' (bi)' if r['form'] == 'bidirectional' else '')


def _models(rows, stopped=()):
  """{series label: the model it draws}: a sweep's names (`tf 1e-3`) and
  stopped runs take their model's style."""
  out = {}
  for r in rows:
    out.setdefault(_label(r), r['model'])
  for r in stopped:
    out.setdefault(_stopped_name(r), r['model'])
  return out


def _stopped_name(r):
  return f'{_label(r)} {r["choice"]} (stopped)'


def _styles(names, models=None):
  """{name: (colour, marker, linestyle)}: each model's fixed style from the
  project's one map (lra/report/plotstyle.py), the same in every figure;
  variants of a model (`gla (bi)`, a second run) its colour with another
  line or marker."""
  from lra.report import plotstyle  # pylint: disable=g-import-not-at-top

  return {
    n: (st['color'], st['marker'], st['linestyle'])
    for n, st in plotstyle.series_styles(names, models=models).items()
  }


def _shared_legend(axes):
  """(handles, labels) of every panel's lines, each label once."""
  handles, labels = [], []
  for ax in axes:
    for h, lab in zip(*ax.get_legend_handles_labels()):
      if lab not in labels:
        handles.append(h)
        labels.append(lab)
  return handles, labels


def _families(rows, names):
  """[(title, names)]: one group for at most plotstyle.MAX_PER_PANEL names,
  else the attention cores (models/attention/) and the sequence mixers
  (models/mixers/) apart, each cut into groups of at most MAX_PER_PANEL,
  one row of panels each, so that no panel draws more lines than it can
  tell apart."""
  from lra.report import plotstyle  # pylint: disable=g-import-not-at-top
  from models.attention import registry  # pylint: disable=g-import-not-at-top

  if len(names) <= plotstyle.MAX_PER_PANEL:
    return [('', list(names))]
  core_of = {}
  for r in rows:
    core_of.setdefault(_label(r), r.get('core') or r['model'])

  def mixer(name):
    try:
      return registry.is_mixer(registry.get_core_class(core_of[name]))
    except UserError:
      return False  # a core this checkout does not have: with the cores

  groups = [
    ('attention cores', [n for n in names if not mixer(n)]),
    ('sequence mixers', [n for n in names if mixer(n)]),
  ]
  out = []
  for title, group in groups:
    parts = -(-len(group) // plotstyle.MAX_PER_PANEL)
    size = -(-len(group) // max(parts, 1))
    for k in range(parts):
      label = f'{title} ({k + 1}/{parts})' if parts > 1 else title
      out.append((label, group[k * size : (k + 1) * size]))
  return out


def _label_panel(ax, xlabel, ylabel, title, family):
  """An accuracy panel's labels, 0-100% range and grid; the family (a row
  of _families) after the title."""
  ax.set_xlabel(xlabel)
  ax.set_ylabel(ylabel)
  ax.set_ylim(-2, 102)
  ax.set_title(f'{title}: {family}' if family else title)
  ax.grid(True, alpha=0.3)


# width_plot: the sideways offset between two models' points, in octaves.
DODGE = 0.04


def width_plot(rows: list[dict], path: str) -> None:
  """Zoology's Figure 2 form: per training setting a panel of test
  accuracy against model width (log2 axis), one line per model; a hollow
  marker is a point whose learning-rate grid has not all finished. Many
  models: a row of panels per family (_families), each with its legend.
  The models of a panel are dodged sideways (a fixed fraction of an
  octave each, DODGE), so that points at one width do not hide each
  other."""
  import matplotlib  # pylint: disable=g-import-not-at-top

  matplotlib.use('Agg')
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top

  settings = settings_of(rows)
  names = list(dict.fromkeys(_label(r) for r in rows))
  families = _families(rows, names)
  style = _styles(names, _models(rows))
  widths = sorted({r['width'] for r in rows})
  fig, axes = plt.subplots(
    len(families), len(settings),
    figsize=(5 * len(settings), 4.6 * len(families)), squeeze=False,
  )  # fmt: skip
  for row_axes, (family, group) in zip(axes, families):
    for ax, (length, pairs) in zip(row_axes, settings):
      for k, name in enumerate(group):
        dodge = 2 ** (DODGE * (k - (len(group) - 1) / 2))
        pts = sorted(
          (
            r['width'] * dodge,
            100 * (r['curve'].get(pairs) or 0.0),
            r['complete'],
          )
          for r in rows
          if _label(r) == name and (r['seq_len'], r['pairs']) == (length, pairs)
        )
        if not pts:
          continue
        colour, marker, line = style[name]
        xs, ys, _ = zip(*pts)
        ax.plot(
          xs, ys, color=colour, linestyle=line, label=name, marker=marker,
          markersize=7,
        )  # fmt: skip
        for x, y, complete in pts:
          if not complete:  # hollow over the filled marker
            ax.plot(
              [x], [y], marker=marker, color=colour, markersize=7,
              markerfacecolor='white', linestyle='none',
            )  # fmt: skip
      ax.set_xscale('log', base=2)
      ax.set_xticks(widths, [str(w) for w in widths])
      ax.minorticks_off()
      ax.set_xlim(min(widths) / 1.5, max(widths) * 1.5)
      _label_panel(
        ax, 'model width (emb_dim; models dodged sideways)',
        'test accuracy (%)',
        f'MQAR: length {length}, {pairs} pairs', family,
      )  # fmt: skip
    handles, labels = _shared_legend(row_axes)
    row_axes[-1].legend(
      handles, labels, loc='center left', bbox_to_anchor=(1.02, 0.5),
      fontsize=9, title='hollow: grid unfinished', title_fontsize=8,
    )  # fmt: skip
  fig.tight_layout()
  fig.savefig(path, dpi=110, bbox_inches='tight')
  plt.close(fig)


def curves_plot(rows: list[dict], path: str, stopped=()) -> None:
  """Validation accuracy against step of each model's chosen run at its
  widest width, one panel per setting: whether the best point had stopped
  rising when training ended; then each `stopped` run (stopped_of), its
  label ending in the step it reached. Many models: a row of panels per
  family (_families)."""
  import matplotlib  # pylint: disable=g-import-not-at-top

  matplotlib.use('Agg')
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top

  settings = settings_of([*rows, *stopped])
  names = list(dict.fromkeys(_label(r) for r in rows))
  extra = [_stopped_name(r) for r in stopped]
  style = _styles([*names, *extra], _models(rows, stopped))
  families = _families([*rows, *stopped], names)
  if len(families) > 1:  # a stopped run goes with its model's family
    family_of = {n: i for i, (_, group) in enumerate(families) for n in group}
    for r, name in zip(stopped, extra):
      families[family_of.get(_label(r), 0)][1].append(name)
  else:
    families = [('', [*names, *extra])]
  fig, axes = plt.subplots(
    len(families), len(settings),
    figsize=(max(6.0, 5 * len(settings)), 4.6 * len(families)),
    squeeze=False,
  )  # fmt: skip
  legends = []
  for row_axes, (family, group) in zip(axes, families):
    for ax, (length, pairs) in zip(row_axes, settings):
      for name in group:
        if name not in names:
          continue
        mine = [
          r
          for r in rows
          if _label(r) == name and (r['seq_len'], r['pairs']) == (length, pairs)
        ]
        if not mine:
          continue
        r = max(mine, key=lambda r: r['width'] or 0)
        vals = val_points(r['workdir'])
        if not vals:
          continue
        colour, marker, line = style[name]
        ax.plot(
          *zip(*vals),
          marker=marker,
          color=colour,
          linestyle=line,
          label=f'{name} (w{r["width"]})',
          markersize=4,
        )
      for r, name in zip(stopped, extra):
        if name not in group or (r['seq_len'], r['pairs']) != (length, pairs):
          continue
        vals = val_points(r['workdir'])
        colour, marker, line = style[name]
        ax.plot(
          *zip(*vals),
          marker=marker,
          color=colour,
          linestyle=line,
          markersize=4,
          label=f'{_stopped_label(r, stopped)} (w{r["width"]}, stopped at '
          f'{r["steps_done"]:,} of {r["num_train_steps"] or 0:,})',
        )
      _label_panel(
        ax, 'training step', 'validation accuracy (%)',
        f'length {length}, {pairs} pairs', family,
      )  # fmt: skip
    legends.append((row_axes, *_shared_legend(row_axes)))
  fig.suptitle('MQAR validation curves (each model at its widest width)')
  fig.tight_layout()
  for row_axes, handles, labels in legends:
    if len(families) == 1 and len(labels) > 8:  # below, not squeezing
      fig.legend(
        handles, labels, loc='upper center', bbox_to_anchor=(0.5, 0.0),
        ncol=2 if len(settings) < 3 else 3, fontsize=9,
      )  # fmt: skip
    else:
      row_axes[-1].legend(
        handles, labels, loc='center left', bbox_to_anchor=(1.02, 0.5),
        fontsize=9,
      )  # fmt: skip
  fig.savefig(path, dpi=110, bbox_inches='tight')
  plt.close(fig)


def _stopped_label(r, stopped):
  """The run's name, with its grid combination when another stopped run
  of the same name is drawn too."""
  same = [o for o in stopped if _label(o) == _label(r)]
  return f'{_label(r)}, {r["choice"]}' if len(same) > 1 else _label(r)


def report(sweep_dirs: list[str], out: str) -> tuple[str, ...]:
  """Writes mqar.md (the width tables, then every row's curve over pairs),
  mqar.png (accuracy against pairs), mqar_width.png (accuracy against
  width, Zoology's Figure 2 form) and mqar_curves.png (validation
  curves); returns their paths. Sweeps whose runs were all stopped
  before their end give mqar.md's "Stopped" table and mqar_curves.png
  alone."""
  stopped = stopped_of(sweep_dirs)
  try:
    rows = rows_of(sweep_dirs)
  except UserError:
    if not stopped:
      raise
    rows = []
  os.makedirs(out, exist_ok=True)
  names = ('mqar.md', 'mqar.png', 'mqar_width.png', 'mqar_curves.png')
  if not rows:
    names = ('mqar.md', 'mqar_curves.png')
  paths = [os.path.join(out, n) for n in names]
  with open(paths[0], 'w') as f:
    if rows:
      f.write(width_markdown(rows) + '\n' + markdown(rows) + '\n\n')
    f.write(stopped_markdown(stopped))
  if rows:
    plot(rows, paths[1])
    width_plot(rows, paths[2])
  curves_plot(rows, paths[-1], stopped)
  return tuple(paths)


def main(argv: list[str]) -> None:
  try:
    if len(argv) > 1:
      raise UserError(f'Unexpected argument {argv[1]!r}; see --help.')
    if not FLAGS.sweeps:
      raise UserError(
        'Give --sweeps, e.g. python -m experiments.mqar.report --sweeps '
        'runs/mqar64,runs/mqar32 --out experiments/mqar.'
      )
    dirs = [d for d in FLAGS.sweeps.split(',') if d]
    print('Wrote ' + ', '.join(report(dirs, FLAGS.out)) + '.')
  except UserError as e:
    print(f'error: {e}', file=sys.stderr)
    sys.exit(2)


if __name__ == '__main__':
  flags.DEFINE_string(
    'sweeps',
    None,
    'Sweep folders (python -m lra.sweep --out) or their archives '
    '(python -m lra.sweep.archive --out), commas.',
  )
  flags.DEFINE_string(
    'out', 'experiments/mqar', 'Folder for mqar.md and mqar.png.'
  )
  app.run(main, flags_parser=cli.parse_flags)
