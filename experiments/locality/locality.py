r"""A locality probe: test accuracy against the attention window, per task.

  python -m experiments.locality.locality --task listops --preset small --out runs/locality \
      [--blocks 2,4,8] [--config.<key>=<value> ...] [--dry_run]
  python -m experiments.locality.locality --task listops --out runs/locality --plot_only

How much of a task is long-range? The `local` model (block-local attention,
models/attention/local.py: each token attends within its own block of
model.attention.block_size positions) is trained at block sizes 2, 4, 8, ...
(the powers of two below the sequence length the attention sees, then that
length itself: one block, exact softmax attention), and the full
`transformer` beside them. A task whose accuracy reaches the transformer's
at a small block is mostly local; one that needs the whole sequence is
long-range. --blocks 2,32 picks the block sizes (integers from 1 to that
length; 1: no token mixing across positions).

The sequence length the attention sees is the task's max_length, plus the
CLS token when the model pools it (ListOps `small`: 200 + 1 = 201, so the
probe's last block is 201: a block of 200 would leave the last token on
its own). MQAR and other per-position tasks have no CLS. Extra test splits
at other lengths (MQAR's data.test_splits) run the same block size: there
the largest block is no longer one block.

Each block size is trained, not only evaluated: one model trained at full
attention and then evaluated with a restricted window would see attention
patterns it never trained on (out of distribution), so its accuracy would
measure the shock of the change, not what a window of that size can learn.
Training a model per block size asks the question the probe means: the
best a model limited to that window does on the task (the same budget,
preset and overrides for every block).

The probe uses the task config's form: MQAR trains in its causal form
(data.form=causal; `local` supports a causal mask, restricted to the block),
--config.data.form=bidirectional probes the other one.

It is a sweep (lra/sweep/main.py), not a runner of its own: each block size is
one run of the grid model.attention.block_size, in its own workdir
OUT/<task>/local[-<preset>]/model.attention.block_size=<b>, and the
transformer's is OUT/<task>/transformer[-<preset>]; the runs resume, skip
when finished and stop on Ctrl-C as a sweep's do (lra/sweep/runner.py), and
OUT/sweep.json, table.md and runs.md are written as by a sweep. Then, from
OUT/sweep.json (every finished local run of the task and preset there, so
probes into one OUT add up):

  OUT/locality_<task>.png  test accuracy against block size (log2 axis),
                           the transformer's as a horizontal line, and
                           chance (1 / classes) for classification tasks
  OUT/locality_<task>.md   block size, test and validation accuracy, wall
                           time and status per run, the transformer last

--plot_only remakes both from OUT/sweep.json and runs nothing (--preset
picks the preset when OUT holds several). --dry_run prints the runs and
their estimated time (lra/sweep/estimate.py) and writes nothing. Exit
status: 0, 1 when a run failed, 130 when interrupted, 2 for bad flags (one
sentence).
"""

from __future__ import annotations

import os
import sys

from absl import app, flags

from lra import data as tasks
from lra.errors import UserError
from lra.sweep import main as sweep
from lra.sweep.plan import OVERRIDE, Catalogue, Run, plan, run_config
from lra.sweep.runner import duration
from lra.train import rundir

KEY = 'model.attention.block_size'
LOCAL, FULL = 'local', 'transformer'


# --------------------------------------------------------------- flags
def define_flags() -> None:
  flags.DEFINE_string('task', None, 'The task to probe, e.g. listops.')
  flags.DEFINE_string(
    'preset',
    None,
    'small, smoke or none (default: none, the reference); with --plot_only '
    'the preset of the probe in OUT (needed when it holds several).',
  )
  flags.DEFINE_string(
    'out', None, 'Sweep folder: OUT/<task>/local[-preset]/..., the plots.'
  )
  flags.DEFINE_string(
    'blocks',
    None,
    'Block sizes, comma-separated (default: 2, 4, 8, ... below the '
    'sequence length, then the length itself).',
  )
  flags.DEFINE_bool(
    'dry_run', False, 'Print the commands and estimated times; run nothing.'
  )
  flags.DEFINE_bool(
    'plot_only',
    False,
    'Remake the plot and table from OUT/sweep.json; run nothing.',
  )
  flags.DEFINE_string(
    'bench',
    None,
    'With --dry_run: a benchmark.py --out folder (lra.sweep.main).',
  )
  sweep.define_probe_flags()


# ---------------------------------------------------------------- plan
def block_sizes(length: int) -> list[int]:
  """[2, 4, 8, ...] below `length`, then `length` (one block)."""
  sizes, size = [], 2
  while size < length:
    sizes.append(size)
    size *= 2
  return [*sizes, length]


def attended_length(config) -> tuple:
  """(the length the attention sees, how: 'max_length 200 + the CLS
  token'): max_length, plus the CLS token the encoder prepends for CLS
  pooling (models/encoder.py)."""
  cls = config['model']['pooling'] == 'cls'
  how = f'max_length {config["max_length"]}' + (
    ' + the CLS token' if cls else ''
  )
  return config['max_length'] + int(cls), how


def parse_blocks(spec: str, length: int, how: str = '') -> list[int]:
  """--blocks '8,2' -> [2, 8]; one sentence unless each is an integer from
  1 to `length`."""
  items = [s.strip() for s in spec.split(',')]
  for item in items:
    if not (item.isdigit() and 1 <= int(item) <= length):
      why = f' ({how})' if how else ''
      example = ','.join(str(b) for b in block_sizes(length)[:3])
      raise UserError(
        f'--blocks {spec!r}: {item!r} is not a block size from 1 to '
        f'{length}, the length the attention sees{why}; give integers '
        f'joined by commas, e.g. --blocks {example},{length}.'
      )
  return sorted({int(s) for s in items})


def probe_runs(
  task: str,
  preset: str,
  out: str,
  overrides=(),
  blocks=(),
  *,
  catalogue: Catalogue,
) -> list[Run]:
  """`local` at each block size (a grid of model.attention.block_size),
  then `transformer`: sweep runs (lra/sweep/plan.py)."""
  grid = ((KEY, tuple(str(b) for b in blocks)),)
  local = plan(
    task, LOCAL, preset, out, overrides, catalogue=catalogue, grid=grid
  )
  return [
    *local,
    *plan(task, FULL, preset, out, overrides, catalogue=catalogue),
  ]


def local_config(task, preset, overrides, *, catalogue: Catalogue):
  """The `local` run's config as train.py will parse it (its default
  block size); one sentence when the overrides do not parse."""
  (run,) = plan(task, LOCAL, preset, '', overrides, catalogue=catalogue)
  config, problem = run_config(run)
  if problem:
    raise UserError(problem)
  return config


def check_task(task) -> None:
  """One sentence unless `task` is one task's name."""
  if task not in tasks.TASKS:
    raise UserError(
      f'Unknown task {task!r} in --task; give one of {", ".join(tasks.TASKS)}.'
    )


def check_flags(task, preset, overrides, catalogue) -> None:
  """One sentence for a task that is not one name, a self-pretraining
  preset or an override of the block size."""
  check_task(task)
  if preset in catalogue.fine_tune:
    raise UserError(
      f'--preset {preset} pretrains, then fine-tunes; the probe trains each '
      f'block size from scratch: give --preset '
      f'{catalogue.fine_tune[preset] or "none"}.'
    )
  for arg in overrides:
    if OVERRIDE.sub('', arg).split('=', 1)[0] == KEY:
      raise UserError(f'The probe sets {KEY} itself (--blocks); drop {arg}.')


# ---------------------------------------------------------- the report
def probe_entries(entries, task, preset) -> tuple:
  """([(block size, entry), ...] by size, the transformer's entry or None)
  of a probe's runs among sweep.json entries."""
  local = Run(task, LOCAL, preset, '').name + '/'
  full = Run(task, FULL, preset, '').name
  blocks = sorted(
    (
      (int(e['grid'][KEY]), e)
      for e in entries
      if e['name'].startswith(local)
      and list(e.get('grid') or {}) == [KEY]
      and str(e['grid'][KEY]).isdigit()
    ),
    key=lambda pair: pair[0],
  )
  transformer = next((e for e in entries if e['name'] == full), None)
  return blocks, transformer


def presets_in(entries, task) -> list[str]:
  """The presets of the local probe runs of `task` among the entries."""
  return list(
    dict.fromkeys(
      e.get('preset') or ''
      for e in entries
      if e['task'] == task
      and e['model'] == LOCAL
      and list(e.get('grid') or {}) == [KEY]
    )
  )


def _finished(entry):
  return (
    entry is not None
    and entry.get('status') in ('done', 'skipped')
    and entry.get('test_accuracy') is not None
  )


def _percent(x):
  return '-' if x is None else f'{100 * x:.2f}%'


def _length_of(entries):
  """attended_length of the first run with a config.json, else None."""
  for e in entries:
    config = rundir.read_config(e['workdir']) if e else None
    if config:
      return attended_length(config)
  return None


def chance(task) -> float | None:
  """1 / classes for a classification task; None for a per-position one."""
  spec = tasks.TASKS[task]
  return None if spec.per_position else 1.0 / spec.num_classes


def markdown(task, preset, blocks, transformer, length, command='') -> str:
  """OUT/locality_<task>.md: a row per block size, the transformer last."""
  runs = [e for _, e in blocks] + [transformer] * bool(transformer)
  splits = list(
    dict.fromkeys(
      name for e in runs if _finished(e) for name in e.get('test_splits') or {}
    )
  )
  lines = [f'# Locality probe: {task} ({preset or "reference"})', '']
  if command:
    lines += [f'`{command}`', '']
  text = (
    'Test accuracy of `local` trained at each block size (each token '
    'attends within its block), and of the full `transformer`.'
  )
  if length:
    text += (
      f' The attention sees {length[0]} positions ({length[1]}): a block '
      f'of {length[0]} is one block, exact softmax attention.'
    )
  level = chance(task)
  if level is not None:
    classes = tasks.TASKS[task].num_classes
    text += f' Chance: {_percent(level)} (1 / {classes} classes).'
  lines += [text, '']
  head = ['block size', 'test', 'val', 'wall', 'status']
  head[2:2] = [f'test {n}' for n in splits]
  lines += ['| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
  rows = [
    (f'{b} (one block)' if length and b >= length[0] else str(b), e)
    for b, e in blocks
  ]
  rows += [('`transformer`', transformer)] if transformer else []
  for label, e in rows:
    done = _finished(e)
    wall = e.get('wall_seconds')
    status = e.get('status')
    cells = [
      label,
      _percent(e.get('test_accuracy')) if done else '-',
      *(
        _percent((e.get('test_splits') or {}).get(n)) if done else '-'
        for n in splits
      ),
      _percent(e.get('val_accuracy')) if done else '-',
      duration(wall) if wall else '-',
      'done' if status == 'skipped' else status,
    ]
    lines.append('| ' + ' | '.join(cells) + ' |')
  answer = summary(blocks, transformer)
  if answer:
    lines += ['', answer]
  return '\n'.join(lines) + '\n'


def summary(blocks, transformer) -> str:
  """The smallest block within one point of the transformer's test
  accuracy, in a sentence ('' without a finished transformer)."""
  if not _finished(transformer):
    return ''
  full = transformer['test_accuracy']
  done = [(b, e['test_accuracy']) for b, e in blocks if _finished(e)]
  if not done:
    return ''
  near = [b for b, acc in done if acc >= full - 0.01]
  if not near:
    return (
      f'No block size tried comes within 1 point of the transformer '
      f'({_percent(full)}).'
    )
  return (
    f'Smallest block size within 1 point of the transformer '
    f'({_percent(full)}): {near[0]}.'
  )


def plot(path, task, preset, blocks, transformer, length) -> None:
  """Test accuracy against block size (log2 axis), the transformer's and
  chance as horizontal lines."""
  import matplotlib  # pylint: disable=g-import-not-at-top

  matplotlib.use('Agg')
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top
  from matplotlib import ticker  # pylint: disable=g-import-not-at-top

  from lra.report import plotstyle  # pylint: disable=g-import-not-at-top

  # Each model in its fixed style, as in every figure of the project.
  styles = plotstyle.series_styles(['local', 'transformer'])
  done = [(b, e['test_accuracy']) for b, e in blocks if _finished(e)]
  fig, ax = plt.subplots(figsize=(7, 4.2))
  xs = [b for b, _ in done]
  ax.plot(
    xs,
    [100 * a for _, a in done],
    label='local, trained at each block size',
    **styles['local'],
  )
  if _finished(transformer):
    full = 100 * transformer['test_accuracy']
    ax.axhline(
      full,
      color=styles['transformer']['color'],
      linestyle=styles['transformer']['linestyle'],
      label=f'transformer ({full:.2f}%)',
    )
  level = chance(task)
  if level is not None:
    ax.axhline(
      100 * level, color='gray', linestyle=':', label=f'chance ({level:.0%})'
    )
  ax.set_xscale('log', base=2)
  ax.xaxis.set_major_locator(ticker.FixedLocator(xs))
  ax.xaxis.set_minor_locator(ticker.NullLocator())
  ax.set_xticks(
    xs,
    [f'{b}\n(one block)' if length and b >= length[0] else str(b) for b in xs],
  )
  ax.set_xlabel('block size (positions each token attends within; log2)')
  ax.set_ylabel('test accuracy (%)')
  ax.set_title(f'Locality: {task} ({preset or "reference"})')
  ax.grid(True, alpha=0.3)
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def write_probe(out, task, preset=None) -> list[str]:
  """OUT/locality_<task>.png and .md from OUT/sweep.json (preset None:
  the one probe of the task there); returns the paths written."""
  data = rundir.read_json(os.path.join(out, 'sweep.json'))
  entries = data.get('runs', []) if isinstance(data, dict) else []
  if preset is None:
    found = presets_in(entries, task)
    if not found:
      raise UserError(
        f'{out}/sweep.json holds no locality probe of {task}; run '
        f'python -m experiments.locality.locality --task {task} --out {out} first.'
      )
    if len(found) > 1:
      names = ', '.join(p or 'none' for p in found)
      raise UserError(
        f'{out} holds probes of {task} with presets {names}; pick one '
        'with --preset.'
      )
    preset = found[0]
  blocks, transformer = probe_entries(entries, task, preset)
  if not blocks and transformer is None:
    raise UserError(
      f'{out}/sweep.json holds no locality probe of {task} with preset '
      f'{preset or "none"}.'
    )
  length = _length_of([e for _, e in blocks] + [transformer])
  command = str(data.get('command') or '')
  if not command.startswith(
    'python -m experiments.locality.locality'
  ) or not any(arg in command.split() for arg in (f'--task={task}', task)):
    command = ''  # a later sweep into OUT, or the probe of another task
  md = os.path.join(out, f'locality_{task}.md')
  with open(md, 'w') as f:
    f.write(markdown(task, preset, blocks, transformer, length, command))
  written = [md]
  if any(_finished(e) for _, e in blocks):
    png = os.path.join(out, f'locality_{task}.png')
    plot(png, task, preset, blocks, transformer, length)
    written.insert(0, png)
  return written


# ---------------------------------------------------------------- main
def main(argv: list[str]) -> None:
  f = flags.FLAGS
  try:
    overrides = sweep.checked_argv(
      argv,
      ('task', 'out'),
      'python -m experiments.locality.locality --task listops --preset small --out '
      'runs/locality',
    )
    if f.plot_only:
      check_task(f.task)
      preset = None if f.preset is None else _preset(f.preset)
      for path in write_probe(f.out, f.task, preset):
        print(f'Wrote {path}.')
      return
    preset = _preset(f.preset or '')
    catalogue = sweep.catalogue()
    check_flags(f.task, preset, overrides, catalogue)
    config = local_config(f.task, preset, overrides, catalogue=catalogue)
    length, how = attended_length(config)
    blocks = (
      parse_blocks(f.blocks, length, how) if f.blocks else block_sizes(length)
    )
    runs = probe_runs(
      f.task, preset, f.out, overrides, blocks, catalogue=catalogue
    )
    status = sweep.execute(runs, 'experiments.locality.locality')
    if status is None:
      return
    try:
      written = write_probe(f.out, f.task, preset)
      print(f'Locality: wrote {" and ".join(written)}.')
    except UserError as e:
      print(f'No locality plot: {e}')
    sys.exit(status)
  except UserError as e:
    print(f'error: {e}', file=sys.stderr)
    sys.exit(2)


def _preset(preset):
  return '' if preset == 'none' else preset


if __name__ == '__main__':
  define_flags()
  app.run(main, flags_parser=sweep.parse_flags)
