r"""CPU seconds and minor page faults per training step, by malloc setting.

  python -m experiments.cpu_cost.cpu_cost                  # the three cells below
  python -m experiments.cpu_cost.cpu_cost --cells main --rounds 3 --out runs/cpu_cost

For each cell (a config's training step on random inputs of its shapes, as
benchmark.py builds it) and each malloc setting, one child process
(`python -m experiments.cpu_cost.cpu_cost --child ...`, since the setting is per
process) compiles the step, runs --warmup steps, then --steps timed steps,
and reports per timed step: user and system CPU seconds and minor page
faults (resource.getrusage of the whole process, every thread), wall
seconds and steps/s; plus the faults of the warm-up steps (where the heap
reaches its size) and the process's peak resident memory. The settings
alternate within each round (keep, system, tcmalloc, keep, ...), so a
shared machine's drift touches them alike.

Settings (lra/allocator.py):
  keep      the default: glibc's malloc told to keep freed memory
  system    LRA_MALLOC=system: glibc's defaults
  tcmalloc  LD_PRELOAD of libtcmalloc_minimal.so.4, the reference; left
            out (with a line saying so) where that library is not found

Cells:
  main    configs/listops.py:transformer,small (the README's main job)
  text1k  configs/text.py:transformer at max_length 1024, batch 4
  text4k  configs/text.py:transformer at max_length 4096, batch 1
The Text cells are the paper's Text model (4 layers, width 256, mlp 1024)
at a smaller batch than its 32, so a step takes seconds on a 2-core CPU;
--batch_text1k / --batch_text4k change it.

Writes cpu_cost.json (one row per child) and cpu_cost.md (the medians per
cell and setting) to --out when given; prints the table.
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import time

import numpy as np

from lra.train import child

SETTINGS = ('keep', 'system', 'tcmalloc')
TCMALLOC_PATHS = (
  '/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4',
  '/usr/lib/aarch64-linux-gnu/libtcmalloc_minimal.so.4',
  '/usr/lib64/libtcmalloc_minimal.so.4',
  '/usr/lib/libtcmalloc_minimal.so.4',
)
CELLS = {
  'main': ['--config=configs/listops.py:transformer,small'],
  'text1k': [
    '--config=configs/text.py:transformer',
    '--config.max_length=1024',
  ],
  'text4k': [
    '--config=configs/text.py:transformer',
    '--config.max_length=4096',
  ],
}
TEXT_BATCH = {'text1k': 4, 'text4k': 1}


def tcmalloc_path() -> str | None:
  """Debian's / Fedora's libtcmalloc_minimal, where installed."""
  return next((p for p in TCMALLOC_PATHS if os.path.exists(p)), None)


def setting_env(setting: str) -> dict:
  """The environment of a child measuring `setting`."""
  env = child.env()  # this process's import root first on PYTHONPATH
  env.pop('LD_PRELOAD', None)
  env['LRA_MALLOC'] = 'system' if setting == 'system' else 'keep'
  if setting == 'tcmalloc':
    env['LD_PRELOAD'] = tcmalloc_path()
  return env


def _usage():
  r = resource.getrusage(resource.RUSAGE_SELF)
  return np.array([r.ru_utime, r.ru_stime, r.ru_minflt, time.perf_counter()])


def _resident_pages():
  """Pages resident now (/proc/self/statm), or None off Linux."""
  try:
    with open('/proc/self/statm') as f:
      return int(f.read().split()[1])
  except (OSError, IndexError, ValueError):
    return None


def measure_step(config_argv, batch_size, steps, warmup) -> dict:
  """One cell in this process: the costs of its timed steps."""
  # Imported here: the parent process needs none of JAX.
  import jax  # pylint: disable=g-import-not-at-top

  from lra import allocator  # pylint: disable=g-import-not-at-top
  from lra import data as tasks  # pylint: disable=g-import-not-at-top
  from lra.train import (  # pylint: disable=g-import-not-at-top
    batching,
    build,
    cli,
    objectives,
    runtime,
  )
  from lra.train import (
    steps as train_steps,
  )

  config = cli.config_from_argv(['cpu_cost', *config_argv])
  if batch_size:
    config.batch_size = batch_size
  task = tasks.get_task(config.task)
  replicated, batch_sharding = runtime.make_mesh()
  graphdef, state = build.create_state(config, task, replicated)
  batch = runtime.to_device(batching.random_batch(config, task), batch_sharding)
  train_step = train_steps.make_train_step(
    graphdef,
    objectives.in_step(config, task),
    config.seed,
    packed_lr=(
      train_steps.learning_rate_schedule(config),
      config.grad_accum_steps,
    ),
  )
  compiled = train_step.lower(state, batch).compile()
  marks, resident = [_usage()], [_resident_pages()]
  for _ in range(warmup + steps):
    state, metrics = compiled(state, batch)
    jax.block_until_ready((state, metrics))
    marks.append(_usage())
    resident.append(_resident_pages())
  user, system, faults, wall = (marks[-1] - marks[warmup]) / steps
  # A fault on a page that stays resident is growth; the rest fault again
  # on pages given back since (glibc's defaults: every page of every step).
  refaults = None
  if None not in resident:
    growth = max(resident[-1] - resident[warmup], 0)
    refaults = float(max(faults * steps - growth, 0) / steps)
  return {
    'allocator': allocator.configure(),
    'task': config.task,
    'length': config.max_length,
    'batch_size': config.batch_size,
    'temp_bytes': int(compiled.memory_analysis().temp_size_in_bytes),
    'warmup_steps': warmup,
    'timed_steps': steps,
    'user_s_per_step': float(user),
    'system_s_per_step': float(system),
    'minflt_per_step': float(faults),
    # Robust to the odd step where the heap grows once.
    'minflt_median_per_step': float(
      np.median(np.diff([m[2] for m in marks[warmup:]]))
    ),
    # Faults per timed step beyond the resident set's growth (None off
    # Linux): pages faulted again after being given back. Independent of
    # when the heap happens to grow, which the order of XLA's frees decides.
    'refaults_per_step': refaults,
    # Each step's own faults, warm-up first: where the heap grows.
    'minflt_steps': [int(b[2] - a[2]) for a, b in zip(marks, marks[1:])],
    'warmup_minflt': int(marks[warmup][2] - marks[0][2]),
    'wall_s_per_step': float(wall),
    'steps_per_sec': float(1 / wall),
    'max_rss_mb': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3,
  }


def measure_in_child(
  config_argv, setting, *, batch_size=None, steps=3, warmup=2, env=None
) -> dict:
  """measure_step in a child process under malloc `setting` (its
  environment from setting_env, updated by `env`); the row, or
  {'error': its last line of stderr}."""
  spec = {
    'config_argv': list(config_argv),
    'batch_size': batch_size,
    'steps': steps,
    'warmup': warmup,
  }
  proc = subprocess.run(
    child.command('experiments.cpu_cost.cpu_cost', '--child', json.dumps(spec)),
    env={**setting_env(setting), **(env or {})},
    capture_output=True,
    text=True,
    check=False,
  )
  lines = proc.stdout.strip().splitlines()
  if proc.returncode or not lines:
    return {'error': (proc.stderr.strip().splitlines() or ['no output'])[-1]}
  return json.loads(lines[-1])


def run_child(cell, setting, args) -> dict:
  """`cell` measured by a child process under `setting`."""
  row = {'cell': cell, 'setting': setting}
  row.update(
    measure_in_child(
      CELLS[cell],
      setting,
      batch_size=getattr(args, f'batch_{cell}', None),
      steps=args.steps,
      warmup=args.warmup,
    )
  )
  return row


COLUMNS = (
  ('steps_per_sec', 'steps/s', '{:.3f}'),
  ('user_s_per_step', 'user s/step', '{:.3f}'),
  ('system_s_per_step', 'system s/step', '{:.3f}'),
  ('system_over_user', 'system/user', '{:.1%}'),
  ('minflt_per_step', 'minor faults/step', '{:,.0f}'),
  ('minflt_median_per_step', 'median step faults', '{:,.0f}'),
  ('refaults_per_step', 'faults beyond growth/step', '{:,.0f}'),
  ('warmup_minflt', 'warm-up faults', '{:,.0f}'),
  ('max_rss_mb', 'peak RSS MB', '{:,.0f}'),
)


def table(rows) -> str:
  """Markdown: the median of each column per (cell, setting)."""
  head = ['cell', 'batch x length', 'malloc', 'runs'] + [c[1] for c in COLUMNS]
  out = ['| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
  for cell in dict.fromkeys(r['cell'] for r in rows):
    for setting in SETTINGS:
      ok = [
        r
        for r in rows
        if r['cell'] == cell and r['setting'] == setting and 'error' not in r
      ]
      if not ok:
        continue
      for r in ok:
        r['system_over_user'] = r['system_s_per_step'] / r['user_s_per_step']
      cells = [
        cell,
        f'{ok[0]["batch_size"]} x {ok[0]["length"]}',
        setting,
        str(len(ok)),
      ]
      cells += [
        (
          fmt.format(float(np.median([r[key] for r in ok])))
          if all(r.get(key) is not None for r in ok)
          else 'n/a'
        )
        if key != 'minflt_median_per_step'
        # Over every timed step of the runs: one step's growth of the heap
        # is one of 3 in a run's own median.
        else fmt.format(
          float(
            np.median(
              [f for r in ok for f in r['minflt_steps'][r['warmup_steps'] :]]
            )
          )
        )
        for key, _, fmt in COLUMNS
      ]
      out.append('| ' + ' | '.join(cells) + ' |')
  errors = [r for r in rows if 'error' in r]
  out += [f'\n{r["cell"]} {r["setting"]}: {r["error"]}' for r in errors]
  return '\n'.join(out) + '\n'


def parse_args(argv):
  p = argparse.ArgumentParser(
    prog='python -m experiments.cpu_cost.cpu_cost',
    description='CPU seconds and minor faults per training step by malloc '
    'setting (lra/allocator.py).',
  )
  p.add_argument(
    '--cells', default=','.join(CELLS), help='of: main,text1k,text4k'
  )
  p.add_argument('--settings', default=','.join(SETTINGS))
  p.add_argument('--rounds', type=int, default=2)
  p.add_argument('--steps', type=int, default=3, help='timed steps')
  p.add_argument('--warmup', type=int, default=2, help='steps before them')
  for cell, batch in TEXT_BATCH.items():
    p.add_argument(f'--batch_{cell}', type=int, default=batch)
  p.add_argument('--out', default=None, help='folder for the json and md')
  p.add_argument('--child', default=None, help=argparse.SUPPRESS)
  args = p.parse_args(argv)
  args.cells = [c for c in args.cells.split(',') if c]
  args.settings = [s for s in args.settings.split(',') if s]
  bad = [c for c in args.cells if c not in CELLS] + [
    s for s in args.settings if s not in SETTINGS
  ]
  if bad:
    p.error(f'unknown cell or setting {bad[0]!r}')
  if args.steps < 1 or args.warmup < 1 or args.rounds < 1:
    p.error('--steps, --warmup and --rounds must be at least 1')
  return args


def main(argv=None):
  args = parse_args(sys.argv[1:] if argv is None else argv)
  if args.child:
    spec = json.loads(args.child)
    row = measure_step(
      spec['config_argv'], spec['batch_size'], spec['steps'], spec['warmup']
    )
    print(json.dumps(row))
    return
  settings = list(args.settings)
  if 'tcmalloc' in settings and not tcmalloc_path():
    settings.remove('tcmalloc')
    print(
      'tcmalloc left out: libtcmalloc_minimal.so.4 not found '
      '(Debian/Ubuntu: apt-get install libtcmalloc-minimal4).',
      file=sys.stderr,
    )
  rows = []
  for r in range(args.rounds):
    for cell in args.cells:
      for setting in settings:
        row = run_child(cell, setting, args)
        row['round'] = r
        rows.append(row)
        what = row.get('error') or (
          f'{row["steps_per_sec"]:.3f} steps/s, '
          f'{row["minflt_per_step"]:,.0f} faults/step'
        )
        print(f'round {r} {cell} {setting}: {what}', file=sys.stderr)
        if args.out:
          os.makedirs(args.out, exist_ok=True)
          with open(os.path.join(args.out, 'cpu_cost.json'), 'w') as f:
            json.dump(rows, f, indent=1)
  text = table(rows)
  if args.out:
    with open(os.path.join(args.out, 'cpu_cost.md'), 'w') as f:
      f.write(text)
  print(text, end='')


if __name__ == '__main__':
  main()
