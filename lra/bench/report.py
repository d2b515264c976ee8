"""benchmark.py's report: its rows as benchmark.md, speed.png and memory.png.

benchmark.md has LRA Table 2's layout (steps/s and peak memory per length,
the paper's numbers beneath ours); the plots draw one line per model against
sequence length. Rows are benchmark.json's (lra/bench/cells.py ROW_FIELDS).

Beneath them, a table of every cell's throughput (steps/s, examples/s,
tokens/s, GFLOP per step and model FLOP utilisation, the fields benchmark.py
adds per cell) and, for --mode loop, the training loop's steps/s against the
bare step's. Cells from --config name their config and task; cells that
did not finish show their status ('OOM', 'error', 'timeout').

With a 'ceiling' row (benchmark.py --ceiling: attention 'none', no token
mixing), benchmark.md notes it and adds two tables: each model's steps/s as
a fraction of the ceiling's, and its memory as a multiple of the ceiling's.

The paper's Table 2 ran batch 32 split over 16 TPU v3 chips (4 x 4, about 2
examples per chip) and gave memory per chip; benchmark.md and the plots'
titles say so beside this run's machine, preset and batch, since only the
ratios to the transformer compare across the two.

LRA's Figure 3 (accuracy against speed, circle area = peak memory) joins a
benchmark with the trained runs' accuracy table: lra/report/bubble.py, which
also reads benchmark.json and names its machine for both.

Redrawn from an archived benchmark.json, with no measuring:
  python -m lra.bench.report BENCHMARK_JSON --out DIR
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from lra.report import plotstyle
from lra.report.bubble import (  # noqa: F401 (the bubble chart's names)
  bubble_chart,
  bubble_figure,
  bubble_points,
  read_benchmark,
  setup,
)
from lra.report.paper import paper

# The model name of benchmark.py --ceiling's row.
CEILING = 'ceiling'


# The paper's Table 2 setting (Tay et al. 2021, section 4.2).
PAPER_BATCH, PAPER_CHIPS = 32, 16


PAPER_SETUP = (
  f'paper: batch {PAPER_BATCH} over {PAPER_CHIPS} TPU v3 chips '
  f'(~{PAPER_BATCH // PAPER_CHIPS} per chip), memory per chip'
)


def _length_name(n):
  return f'{n // 1024}K' if n % 1024 == 0 else str(n)


def _num(x):
  return f'{x:.3g}' if x < 1000 else f'{x:.0f}'


def _ratio(x, base):
  if x is None or not base:
    return ''
  r = x / base
  return f' ({r:.1f}x)' if r >= 1 else f' ({r:.2f}x)'


def _table(title, rows, models, lengths, value, paper_values):
  """Markdown rows: ours per model, the paper's (italic) beneath."""
  head = '| model | ' + ' | '.join(_length_name(n) for n in lengths) + ' |'
  lines = [f'### {title}', '', head, '|---' * (len(lengths) + 1) + '|']
  for m in models:
    cells = []
    for n in lengths:
      row, base = rows.get((m, n)), rows.get(('transformer', n))
      if row is None:
        cells.append('-')
      elif row['status'] != 'ok':
        cells.append(row['status'])
      else:
        ok = base is not None and base['status'] == 'ok'
        v = value(row)
        cells.append(_num(v) + _ratio(v, value(base) if ok else None))
    lines.append(f'| {m} | ' + ' | '.join(cells) + ' |')
    paper_lengths = paper()['table2_efficiency']['lengths']
    if m in paper_values and set(lengths) & set(paper_lengths):
      cells = []
      for n in lengths:
        if n not in paper_lengths:
          cells.append('')
          continue
        j = paper_lengths.index(n)
        v, base = paper_values[m][j], paper_values['transformer'][j]
        cells.append(f'*{_num(v)}{_ratio(v, base)}*')
      lines.append('| *paper* | ' + ' | '.join(cells) + ' |')
  return lines


def _ceiling_tables(rows, models, lengths):
  """Speed fraction and memory multiple of each model against the ceiling."""

  def cells(m, value, fmt):
    out = []
    for n in lengths:
      row, top = rows.get((m, n)), rows.get((CEILING, n))
      if row is None:
        out.append('-')
      elif row['status'] != 'ok':
        out.append(row['status'])
      elif top is None or top['status'] != 'ok':
        out.append('-')
      else:
        out.append(fmt(value(row) / value(top)))
    return out

  head = '| model | ' + ' | '.join(_length_name(n) for n in lengths) + ' |'
  rule = '|---' * (len(lengths) + 1) + '|'
  others = [m for m in models if m != CEILING]
  lines = []
  for title, value, fmt in (
    (
      "Speed as a fraction of the ceiling (steps/s over the ceiling's; "
      '1 = as fast as no attention)',
      lambda r: r['steps_per_sec'],
      lambda x: f'{x:.2f}' if x < 10 else f'{x:.0f}',
    ),
    (
      "Memory as a multiple of the ceiling (peak over the ceiling's; "
      '1 = no more than no attention)',
      lambda r: r['peak_memory_bytes'],
      lambda x: f'{x:.2f}x' if x < 10 else f'{x:.0f}x',
    ),
  ):
    lines += ['', f'### {title}', '', head, rule]
    lines += [
      f'| {m} | ' + ' | '.join(cells(m, value, fmt)) + ' |' for m in others
    ]
  return lines


def _speed_kind(row):
  """How a row's steps/s was timed (benchmark.py --mode)."""
  n = row['timed_steps']
  if row.get('mode') in ('throughput', 'loop'):
    return f'{n} timed steps back to back, one wait at the end,'
  return f'median of {n} timed steps'


def _cell_value(row, value):
  """A table cell: the value of an ok row, else the row's status."""
  if row['status'] != 'ok':
    return row['status']
  v = value(row)
  return '-' if v is None else v


def _throughput_table(rows):
  """Per cell: steps/s, examples/s, tokens/s, FLOPs per step and MFU."""
  head = (
    '| model | task | length | batch | mode | steps/s | examples/s | '
    'tokens/s | GFLOP/step | MFU |'
  )
  lines = [
    '',
    '### Throughput and model FLOP utilisation',
    '',
    'examples/s = steps/s x batch; tokens/s = examples/s x max_length x '
    "documents per example (CLS not counted); GFLOP/step from XLA's cost "
    'analysis of the compiled step (per device; not counting custom calls '
    'such as cuDNN attention); MFU = FLOP/step x steps/s / the peak FLOP/s '
    'of one device' + _peak_sources(rows) + '.',
    '',
    head,
    '|---' * 10 + '|',
  ]
  for r in rows:
    cells = [
      _cell_value(r, lambda r: _num(r['steps_per_sec'])),
      _cell_value(r, lambda r: _num(r.get('examples_per_sec') or 0)),
      _cell_value(r, lambda r: _num(r.get('tokens_per_sec') or 0)),
      _cell_value(
        r,
        lambda r: (
          None
          if r.get('flops_per_step') is None
          else _num(r['flops_per_step'] / 1e9)
        ),
      ),
      _cell_value(
        r, lambda r: None if r.get('mfu') is None else f'{r["mfu"]:.1%}'
      ),
    ]
    lines.append(
      f'| {r["model"]} | {r.get("task") or "text"} | {r["length"]} | '
      f'{r["batch_size"]} | {r.get("mode") or "latency"} | '
      + ' | '.join(str(c) for c in cells)
      + ' |'
    )
  return lines


def _peak_sources(rows):
  """' (peaks: 989 TFLOP/s, NVIDIA H200 datasheet, bfloat16)', or why
  there is no MFU."""
  peaks = {
    (r['peak_flops_per_sec'], r['peak_flops_source'])
    for r in rows
    if r.get('peak_flops_per_sec')
  }
  if not peaks:
    return (
      ' (no peak known for this device: MFU is empty; benchmark.py '
      '--peak_flops gives one)'
    )
  return (
    ' (peak: '
    + '; '.join(
      f'{p / 1e12:g} TFLOP/s, {source}' for p, source in sorted(peaks)
    )
    + ')'
  )


def _loop_table(rows):
  """--mode loop: train.py's loop against the bare step, per cell."""
  loop = [r for r in rows if r.get('mode') == 'loop']
  if not loop:
    return []
  lines = [
    '',
    '### Training loop against the bare step',
    '',
    "loop: train.py's train_and_evaluate on the config's data (steps/s of "
    "metrics.jsonl's train rows, every step after the compiled first one; "
    'evaluation and checkpoints after the last step, outside the timer); '
    'bare: the compiled step alone on the same shapes, back to back, in the '
    'same process.',
    '',
    '| model | task | length | batch | loop steps/s | bare steps/s | '
    'loop / bare |',
    '|---' * 7 + '|',
  ]
  for r in loop:
    cells = [
      _cell_value(
        r,
        lambda r: (
          None
          if r.get('loop_steps_per_sec') is None
          else _num(r['loop_steps_per_sec'])
        ),
      ),
      _cell_value(r, lambda r: _num(r['bare_steps_per_sec'])),
      _cell_value(
        r,
        lambda r: (
          None
          if r.get('loop_over_bare') is None
          else f'{r["loop_over_bare"]:.2f}'
        ),
      ),
    ]
    lines.append(
      f'| {r["model"]} | {r.get("task") or "text"} | {r["length"]} | '
      f'{r["batch_size"]} | ' + ' | '.join(str(c) for c in cells) + ' |'
    )
  return lines


def markdown(rows, seconds=None, load=None):
  """LRA Table 2 layout: steps/s and peak memory per length."""
  by_cell = {(r['model'], r['length']): r for r in rows}
  models = list(dict.fromkeys(r['model'] for r in rows))
  lengths = sorted({r['length'] for r in rows if r['length'] is not None})
  # The machine is the first row that reached it (a cell killed before it
  # started has none).
  first = next((r for r in rows if r.get('backend')), rows[0])
  configs = {r['model']: r['model_config'] for r in rows if r['model_config']}
  mc = next(iter(configs.values()), None) or {}
  table2 = paper()['table2_efficiency']
  took = '' if seconds is None else f'; measured in {seconds:.0f} s'
  load = '' if load is None else f' (load average {load:.1f} at the start)'
  has_base = any(
    r['model'] == 'transformer' and r['status'] == 'ok' for r in rows
  )
  against = (
    'speed-up against `transformer` (einsum softmax) at that length'
    if has_base
    else 'none: the exact `transformer` was not measured in this run (add '
    'it with `--baselines` or `--models transformer,...`)'
  )
  lines = [
    '## LRA speed and memory (Table 2 layout)',
    '',
    f'Setup: {setup(first)}.',
    f'Machine: {first["device_count"]} x {first["device_kind"]} '
    f'({first["backend"]} backend), {os.cpu_count()} CPU cores{load}; jax '
    f'{first["jax_version"]}, flax {first["flax_version"]}{took}.',
    (
      f'Config `{first["config"]}` ({first.get("task")} task)'
      if first.get('config')
      else f'Preset `{first["preset"]}`'
    )
    + f': batch {first["batch_size"]}, '
    f'layers {mc.get("num_layers")}, emb {mc.get("emb_dim")}, '
    f'qkv {mc.get("qkv_dim")}, mlp {mc.get("mlp_dim")}, '
    f'{mc.get("num_heads")} heads, {mc.get("dtype")}; '
    + (
      "that config's training step on random inputs of its batches' shapes"
      if first.get('config')
      else 'byte-level Text classifier on random bytes'
    )
    + ', one step = forward + backward + AdamW update'
    + (', sequence = length + 1 (CLS).' if mc.get('pooling') == 'cls' else '.'),
    f'Speed: steps per second, {_speed_kind(first)} '
    f'after compilation and {first["warmup_steps"]} warm-up step(s); '
    f'(x) = {against}.',
    f'Dropout as in training: {mc.get("dropout_rate")}; attention dropout '
    + ', '.join(
      f'{m} {c["attention_dropout_rate"]}' for m, c in configs.items()
    )
    + '.',
    "Memory: peak GB of the compiled train step by XLA's memory analysis "
    '(temp + arguments + outputs - donated aliases, per device); (x) = '
    + ('ratio to `transformer`.' if has_base else 'none (no `transformer`).'),
    '*paper*: LRA Table 2 (Tay et al. 2021; Text, batch 32, 4x4 TPU v3, '
    'peak memory per device in GB).',
    f"Not the same setting: the paper's batch of {PAPER_BATCH} was split "
    f'over {PAPER_CHIPS} TPU v3 chips (about {PAPER_BATCH // PAPER_CHIPS} '
    'examples per chip, 1 per TensorCore) and its memory is per device, '
    f'while this run holds {first["batch_size"]} example(s) per step on '
    f'{first["device_count"]} device(s): absolute steps/s and GB do not '
    'compare with the paper, only the ratios to `transformer` do. '
    f'`--batch_size {PAPER_BATCH // PAPER_CHIPS}` on one device holds what '
    'one of its chips held (`--batch_size 1`: one TensorCore).',
    '',
  ]
  if first.get('config'):  # not the Text cells: no paper numbers to set by
    lines = [ln for ln in lines if not ln.startswith(('*paper*', 'Not the'))]
  fused = sorted({r['model'] for r in rows if r.get('fused_attention_kernel')})
  if fused:
    lines[-1:-1] = [
      'cuDNN fused (flash) attention was compiled into the step of: '
      + ', '.join(f'`{m}`' for m in fused)
      + ' (the other cells write attention out as XLA ops).'
    ]
  if CEILING in models:
    lines[-1:-1] = [
      '`ceiling`: no attention at all (core `none`, out = v: no token '
      "mixing; q and k unused) in the transformer's config, measured in "
      'the same run: the best speed and memory any attention could reach '
      'at this width. Not an LRA model.',
    ]
  lines += _table(
    'Steps per second',
    by_cell,
    models,
    lengths,
    lambda r: r['steps_per_sec'],
    {} if first.get('config') else table2['steps_per_sec'],
  )
  lines.append('')
  lines += _table(
    'Peak memory (GB)',
    by_cell,
    models,
    lengths,
    lambda r: r['peak_memory_bytes'] / 1e9,
    {} if first.get('config') else table2['peak_memory_gb'],
  )
  lines += _throughput_table(rows)
  lines += _loop_table(rows)
  if CEILING in models:
    lines += _ceiling_tables(by_cell, models, lengths)
  lines += failure_lines(rows)
  return '\n'.join(lines) + '\n'


def failure_lines(rows):
  """The lines under a table (this one and the layer table,
  lra/bench/layer.py) naming each cell that did not finish, and why."""
  failed = [r for r in rows if r['status'] != 'ok']
  if not failed:
    return []
  return ['', 'Failures:'] + [
    f'- {r["model"]} at {r["length"]}: {r["status"]}, {r["error"]}'
    for r in failed
  ]


def plot(rows, value, ylabel, path):
  """One line per model against length, both axes logarithmic, each model
  in its fixed style (lra/report/plotstyle.py); past
  plotstyle.MAX_PER_PANEL models, a panel per family (attention cores,
  sequence mixers), each with the transformer and the ceiling as
  references, on shared axes. The title gives the machine, preset and
  batch, and the paper's setting."""
  import matplotlib  # pylint: disable=g-import-not-at-top

  matplotlib.use('Agg')
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top
  from matplotlib import ticker  # pylint: disable=g-import-not-at-top

  models = [
    m
    for m in dict.fromkeys(r['model'] for r in rows)
    if any(r['model'] == m and r['status'] == 'ok' for r in rows)
  ]
  styles = plotstyle.series_styles(models)
  groups = plotstyle.panels(models, shared=(CEILING, 'transformer'))
  fig, axes = plt.subplots(
    len(groups),
    1,
    figsize=(7.5, 4.5 * len(groups)),
    squeeze=False,
    sharex=True,
    sharey=True,
  )
  lengths = sorted({r['length'] for r in rows if r['length'] is not None})
  for ax, (family, group) in zip(axes[:, 0], groups):
    for m in group:
      ok = [r for r in rows if r['model'] == m and r['status'] == 'ok']
      ax.plot(
        [r['length'] for r in ok],
        [value(r) for r in ok],
        label=m,
        **styles[m],
      )
    ax.set_xscale('log', base=2)
    ax.set_yscale('log')
    ax.set_xticks(lengths, [_length_name(n) for n in lengths])
    ax.minorticks_off()
    ax.yaxis.set_major_locator(ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda y, _: f'{y:g}'))
    ax.tick_params(labelbottom=True)
    ax.set_xlabel('sequence length (tokens)')
    ax.set_ylabel(ylabel)
    if family:
      ax.set_title(family, fontsize=9)
    ax.grid(True, alpha=0.3)
    if ax.lines:
      ax.legend(fontsize=8, loc='center left', bbox_to_anchor=(1.0, 0.5))
  fig.suptitle(
    f'{setup(next((r for r in rows if r.get("backend")), rows[0]))}\n'
    f'{PAPER_SETUP}: compare ratios to transformer only',
    fontsize=8,
  )
  fig.tight_layout()
  fig.savefig(path, dpi=120, bbox_inches='tight')
  plt.close(fig)


def write_report(rows, out, seconds=None, load=None):
  with open(os.path.join(out, 'benchmark.md'), 'w') as f:
    f.write(markdown(rows, seconds, load))
  plot(
    rows,
    lambda r: r['steps_per_sec'],
    'training steps per second',
    os.path.join(out, 'speed.png'),
  )
  plot(
    rows,
    lambda r: r['peak_memory_bytes'] / 1e9,
    'peak memory (GB, XLA memory analysis)',
    os.path.join(out, 'memory.png'),
  )


def main(argv=None):
  """Writes benchmark.md, speed.png and memory.png from a benchmark.json."""
  parser = argparse.ArgumentParser(
    prog='python -m lra.bench.report',
    description='Redraw a benchmark.py report from its benchmark.json.',
  )
  parser.add_argument('rows', metavar='BENCHMARK_JSON')
  parser.add_argument('--out', required=True, metavar='DIR')
  args = parser.parse_args(argv)
  try:
    with open(args.rows) as f:
      rows = json.load(f)
  except (OSError, ValueError) as e:
    sys.exit(f'error: cannot read {args.rows} as a benchmark.json ({e}).')
  if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
    sys.exit(f'error: {args.rows} is not a list of benchmark rows.')
  os.makedirs(args.out, exist_ok=True)
  write_report(rows, args.out)
  print(f'wrote {args.out}/benchmark.md, speed.png, memory.png')


if __name__ == '__main__':
  main()
