r"""The MQAR comparison from sweeps: a table and a plot in Zoology's style.

  python -m lra.lab.mqar_report --sweeps runs/mqar64,runs/mqar32 --out docs/mqar

reads each sweep folder's sweep.json (python -m lra.lab.sweep --tasks mqar
..., with or without --grid) and writes into --out:

  mqar.md    one row per (model, data form, width): the learning rate (or
             other grid combination) chosen on validation (lra/lab/sweep_grid.py:
             best validation accuracy), how many grid runs finished (the
             choice is among those), and the test accuracy of that run
             at each number of key-value pairs at the training length, then
             at the other extra test splits; a model whose runs have not all
             finished is marked partial;
  mqar.png   accuracy against the number of pairs at the training length
             (log2 axis), one line per model, one panel per width (Zoology,
             arXiv 2312.04927, plots recall against width and pairs).

The x axis joins the run's own test split (its data.seq_len and
data.num_kv_pairs) with its extra test splits of the same length
(data.test_splits entries `seq_len:pairs`); splits at other lengths are
table columns only. Width is the run's model.emb_dim; the form is its
data.form (bidirectional rows, for encoders that cannot be causal, are
marked `bi`). A (model, form, width) found in two sweeps is an error (one
sentence): give each comparison once.
"""

from __future__ import annotations

import os
import sys

from absl import app, flags

from lra.errors import UserError
from lra.lab import sweep_grid
from lra.train import cli, rundir

FLAGS = flags.FLAGS


def _percent(x):
  return '-' if x is None else f'{100 * x:.1f}'


def _split_shape(name):
  length, pairs = name.split(':')
  return int(length), int(pairs)


def rows_of(sweep_dirs: list[str]) -> list[dict]:
  """One dict per (model, form, width) of the sweeps' mqar runs (tuned by
  the grid when there is one): model, form, width, choice, complete,
  seq_len, curve {pairs: accuracy}, splits {name: accuracy}."""
  rows, seen = [], {}
  for folder in sweep_dirs:
    sweep = rundir.read_json(os.path.join(folder, 'sweep.json'))
    if not isinstance(sweep, dict):
      raise UserError(
        f'--sweeps {folder}: no sweep.json in it; give the --out folder of '
        'a finished python -m lra.lab.sweep --tasks mqar run.'
      )
    entries = [
      dict(e, grid=e.get('grid') or {})
      for e in sweep.get('runs', [])
      if e.get('task') == 'mqar'
    ]
    for tuned in sweep_grid.tuned_rows(entries):
      best = tuned['best']
      if best is None:
        continue
      config = rundir.read_config(best['workdir']) or {}
      data, model = config.get('data', {}), config.get('model', {})
      key = (tuned['model'], data.get('form'), model.get('emb_dim'))
      if key in seen:
        raise UserError(
          f'{key[0]} ({key[1]}, width {key[2]}) is in both {seen[key]} and '
          f'{folder}; give each comparison once in --sweeps.'
        )
      seen[key] = folder
      length, pairs = data.get('seq_len'), data.get('num_kv_pairs')
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
          model=tuned['model'],
          form=data.get('form'),
          width=model.get('emb_dim'),
          choice=sweep_grid.label(tuple(best['grid'].items())),
          complete=tuned['complete'],
          finished=sum(
            e.get('status') in ('done', 'skipped') for e in tuned['runs']
          ),
          seq_len=length,
          curve=dict(sorted(curve.items())),
          splits=splits,
        )
      )
  if not rows:
    raise UserError(
      f'--sweeps {",".join(sweep_dirs)}: no finished mqar run in them; run '
      'python -m lra.lab.sweep --tasks mqar ... first.'
    )
  return sorted(rows, key=lambda r: (r['width'] or 0, r['form'] or ''))


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
      f'`{r["model"]}`',
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
  import matplotlib  # pylint: disable=g-import-not-at-top

  matplotlib.use('Agg')
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top

  widths = sorted({r['width'] for r in rows})
  models = list(dict.fromkeys(r['model'] for r in rows))
  colours = plt.get_cmap('tab20')
  markers = 'osD^v<>ph*'
  fig, axes = plt.subplots(
    1, len(widths), figsize=(5.5 * len(widths) + 2.5, 4.5), squeeze=False
  )
  for ax, width in zip(axes[0], widths):
    for r in rows:
      if r['width'] != width or not r['curve']:
        continue
      i = models.index(r['model'])
      xs = list(r['curve'])
      ys = [100 * (r['curve'][x] or 0.0) for x in xs]
      name = r['model'] + (' (bi)' if r['form'] == 'bidirectional' else '')
      ax.plot(
        xs,
        ys,
        marker=markers[i % len(markers)],
        color=colours(i % 20),
        linestyle='--' if r['form'] == 'bidirectional' else '-',
        label=name,
      )
    ax.set_xscale('log', base=2)
    ax.set_xlabel(f'key-value pairs (length {rows[0]["seq_len"]})')
    ax.set_ylabel('test accuracy (%)')
    ax.set_ylim(-2, 102)
    ax.set_title(f'MQAR, width {width}')
    ax.grid(True, alpha=0.3)
  handles, labels = axes[0][-1].get_legend_handles_labels()
  for ax in axes[0][:-1]:
    for h, lab in zip(*ax.get_legend_handles_labels()):
      if lab not in labels:
        handles.append(h)
        labels.append(lab)
  fig.legend(handles, labels, loc='center right', fontsize=8)
  fig.tight_layout(rect=(0, 0, 1 - 2.3 / fig.get_size_inches()[0], 1))
  fig.savefig(path, dpi=110)
  plt.close(fig)


def report(sweep_dirs: list[str], out: str) -> tuple[str, str]:
  rows = rows_of(sweep_dirs)
  os.makedirs(out, exist_ok=True)
  md, png = os.path.join(out, 'mqar.md'), os.path.join(out, 'mqar.png')
  with open(md, 'w') as f:
    f.write(markdown(rows) + '\n')
  plot(rows, png)
  return md, png


def main(argv: list[str]) -> None:
  try:
    if len(argv) > 1:
      raise UserError(f'Unexpected argument {argv[1]!r}; see --help.')
    if not FLAGS.sweeps:
      raise UserError(
        'Give --sweeps, e.g. python -m lra.lab.mqar_report --sweeps '
        'runs/mqar64,runs/mqar32 --out docs/mqar.'
      )
    dirs = [d for d in FLAGS.sweeps.split(',') if d]
    md, png = report(dirs, FLAGS.out)
    print(f'Wrote {md} and {png}.')
  except UserError as e:
    print(f'error: {e}', file=sys.stderr)
    sys.exit(2)


if __name__ == '__main__':
  flags.DEFINE_string(
    'sweeps', None, 'Sweep folders (python -m lra.lab.sweep --out), commas.'
  )
  flags.DEFINE_string('out', 'docs/mqar', 'Folder for mqar.md and mqar.png.')
  app.run(main, flags_parser=cli.parse_flags)
