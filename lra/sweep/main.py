r"""A resumable sweep over tasks x models: LRA Table 1 as one command.

  python -m lra.sweep --tasks listops,pathfinder --models all \
      --preset small --out runs/sweep [--config.<key>=<value> ...] \
      [--dry_run] [--bench DIR] [--noprobe] [--jobs K]
  python -m lra.sweep --sweep experiments/mqar/sweeps.py:width_grid \
      --out runs/mqar [the flags above: they replace or extend the file's]

Each (task, model) trains in its own workdir OUT/<task>/<model>[-<preset>],
one after the other (--jobs K: up to K at once), by the command a user would
type,

  python train.py --config configs/<task>.py:<model>[,<preset>] \
      --workdir OUT/<task>/<model>[-<preset>] [--config.<key>=<value> ...]

run as a subprocess (its progress bar and messages pass through), so every run
resumes like any train.py run and shows in `python eval.py --table OUT`.

--tasks and --models: names joined by commas, or 'all' (every task of
lra/data/__init__.py; every model of lra/train/options.py), '-name' leaves
one out (`--models all,-transformer_fused`). --preset: small, smoke,
zoology (mqar's own: Zoology's block at small's sizes), or none (the
LRA reference configuration). --config.* overrides go to every run unchanged.

Self-pretraining: --preset small_spt (or smoke_spt, spt; configs/base.py)
gives two runs per (task, model), the pretraining then its fine-tune:

  python train.py --config configs/<task>.py:<model>,small_spt \
      --workdir OUT/<task>/<model>-small_spt
  python train.py --config configs/<task>.py:<model>,small \
      --workdir OUT/<task>/<model>-small_spt-ft \
      --config.init_from=OUT/<task>/<model>-small_spt

The fine-tune runs only when its pretraining finished (else it is recorded
as failed, not run). The overrides of objective, mask_rate and
model.tie_lm_head go to the pretraining alone (--config.objective=causal_lm
pretrains left to right); --config.init_from is refused (the sweep sets it).

A run is skipped when its workdir holds a finished run of the same config
(results.json for the configured num_train_steps, config.json equal). A run
that fails (train.py exits non-zero) is recorded with its one-line error (its
last `error:` line, else its last line) and exit status; the sweep goes on.
After each run, OUT/sweep.json records every run (entries of earlier sweeps
into OUT that this one does not plan are kept) and OUT/table.md holds
`eval.py --table OUT`. Per run: task, model, preset, workdir, command, status
(done, failed, skipped = finished before, interrupted, pending = not reached
after an interrupt), exit status, message, wall_seconds (train.py's wall time
over every sweep that ran it), steps_per_sec (the median of metrics.jsonl's
training rates), steps_done, best_step, val_accuracy, test_accuracy (the one
the table reports: results.json `select`) and selection, val_loss and
test_loss, objective (classify, or causal_lm / masked_lm for a pretraining
run: it has no accuracy; its test_token_accuracy and, for causal_lm,
test_perplexity are those of its checkpoint of lowest validation loss).
table.md has the pretraining runs' losses below the accuracy table.
OUT/runs.md is one row per classification run: status, test accuracy, best
validation accuracy and step, wall time, steps/s and the LRA paper's Table 1
number (the README's CPU-scale table is made from it).

Ctrl-C (or SIGTERM) is passed to the running train.py as one Ctrl-C: it
finishes its step, saves a checkpoint and exits; the sweep records that run as
interrupted, writes sweep.json and table.md and exits with 130. A second
Ctrl-C stops train.py at once (its last saved checkpoint stays). The same
command resumes the sweep: finished runs are skipped, the interrupted one
resumes from its checkpoint. Exit status: 0, 1 when a run failed, 130 when
interrupted, 2 for bad flags (one sentence).

--dry_run prints each run's command and an estimate of its training time
and writes nothing. The rate is the one measured in the run's workdir when it
has trained before, else benchmark.py's steps/s for the model (--bench,
default runs/bench/benchmark.json) at the benchmarked length nearest the
run's, scaled by the ratio of a dense Transformer's cost per step (batch x
length x layers x (4 E Q + 2 E M + 2 length Q)) of the benchmark cell to the
run's: rough (within about 2x of measured ListOps and Pathfinder `small`
runs), closer when the benchmark ran at the sweep's lengths
(`python benchmark.py --lengths 200,1024 --out runs/bench`); both count
training steps only. Else (--probe, the default) the run's own config is
probed on this machine (lra/sweep/probe.py): its training and
evaluation steps compiled and timed on random data of the task's shapes,
once per distinct config (the compile time plus --probe_seconds, default
2); the estimate adds the measured compilation and the run's evaluations
(when the split sizes are known: the prepared cache, or the config's
data.num_val / num_test) and gives a range in minutes from the fastest and
slowest probed steps. Data generation is never counted.

--sweep FILE.py:FN reads the sweep from a Python file (lra/sweep/spec.py:
FN returns tasks, models, preset, grid axes and config overrides, or a
list of such sweeps, each into its own folder below --out).

The pieces: lra/sweep/spec.py (sweep files), lra/sweep/plan.py (the runs
and their commands), lra/sweep/runner.py (running them, reading their
results, sweep.json and runs.md), lra/sweep/estimate.py (--dry_run); this
module is the command line.
"""

from __future__ import annotations

import shlex
import sys

from absl import app, flags

from lra import commands
from lra.errors import UserError
from lra.sweep import grid as sweep_grid
from lra.sweep import spec as sweep_spec
from lra.sweep.estimate import DEFAULT_BENCH, dry_run
from lra.sweep.plan import OVERRIDE, Catalogue, plan, run_config
from lra.sweep.runner import Sweep
from lra.train import cli, validate


# --------------------------------------------------------------- flags
def define_flags() -> None:
  flags.DEFINE_string(
    'tasks', None, "Tasks, comma-separated, or 'all'; '-name' drops one."
  )
  flags.DEFINE_string(
    'models', None, "Models, comma-separated, or 'all'; '-name' drops one."
  )
  flags.DEFINE_string(
    'preset',
    '',
    'small, smoke, small_spt (self-pretraining, then the fine-tune), '
    "smoke_spt, spt, zoology (mqar only: Zoology's block at small's "
    'sizes, configs/mqar.py) or none (default: none, the reference).',
  )
  flags.DEFINE_string('out', None, 'Sweep folder: OUT/<task>/<model>[-preset].')
  flags.DEFINE_string(
    'sweep',
    None,
    'FILE.py:FN: the sweep written as a Python file, FN() returning a dict '
    '(or a list of dicts, one sweep each) of tasks, models, preset, grid, '
    'config and out (a folder below --out); lra/sweep/spec.py. Flags beside '
    "it win: --tasks, --models, --preset replace the file's; --grid and "
    "--config.* add keys or replace the file's values of the same key.",
  )
  flags.DEFINE_multi_string(
    'grid',
    [],
    'key=v1,v2,...: config values to try per (task, model); several --grid '
    'flags give their cross product; OUT/tuned.md reports the best on '
    'validation (lra/sweep/grid.py).',
  )
  flags.DEFINE_bool(
    'dry_run', False, 'Print the commands and estimated times; run nothing.'
  )
  flags.DEFINE_integer(
    'jobs',
    1,
    'Runs at once (in plan order as slots free up; a fine-tune waits for '
    'its pretraining). Above 1 each run writes its output to '
    '<workdir>/train.log and, on a GPU, they share it (XLA preallocation '
    'off): for small models on an accelerator, e.g. MQAR grids '
    '(docs/sweeps.md).',
    lower_bound=1,
  )
  flags.DEFINE_bool(
    'retry_diverged',
    False,
    'Run again a run that an earlier sweep into --out stopped on a '
    'non-finite loss, gradient or parameter norm (default: skip it while '
    'its config is unchanged: the same seed diverges again; a grid counts '
    'it as tried).',
  )
  flags.DEFINE_string(
    'bench',
    None,
    f'With --dry_run: a benchmark.py --out folder or its benchmark.json '
    f'(default {DEFAULT_BENCH} when present).',
  )
  define_probe_flags()


def define_probe_flags() -> None:
  """--probe and --probe_seconds, read by --dry_run (execute)."""
  flags.DEFINE_bool(
    'probe',
    True,
    'With --dry_run: time a run that has neither trained before nor a '
    'benchmark row by a short probe of its compiled steps on random data '
    '(once per distinct config: its compile time plus --probe_seconds).',
  )
  flags.DEFINE_float(
    'probe_seconds',
    2.0,
    'With --dry_run: seconds of timed training steps per probe (at least 3 '
    'steps).',
  )


def parse_flags(argv: list[str]) -> list[str]:
  """absl flags_parser: --config.* overrides pass through to train.py."""
  overrides = [a for a in argv[1:] if OVERRIDE.match(a)]
  rest = [argv[0], *(a for a in argv[1:] if not OVERRIDE.match(a))]
  return [*cli.parse_flags(rest), *overrides]


def catalogue() -> Catalogue:
  """The presets of configs/base.py (through the config loader,
  lra/train/config.py) and every model name (lra/train/options.py) for
  `plan`. Loads the attention registry to list every registered core."""
  from lra.train import config as config_loader  # pylint: disable=g-import-not-at-top
  from lra.train import options  # pylint: disable=g-import-not-at-top

  presets, aliases, fine_tune = config_loader.presets()
  return Catalogue(
    presets=presets,
    aliases=tuple(aliases),
    fine_tune=fine_tune,
    models=tuple(options.known_models()),
  )


def attention_problem(config) -> str | None:
  """train.py's sentence for model.attention options its core does not
  take (lra/train/options.py check_attention), or None."""
  from lra.train import options  # pylint: disable=g-import-not-at-top

  try:
    options.check_attention(config)
  except UserError as e:
    return str(e)
  return None


def check_grid(runs) -> None:
  """One sentence when a grid value is no valid config value (checked on
  the first run of each combination: train.py's own parsing)."""
  seen = set()
  for run in runs:
    if not run.grid or run.grid in seen:
      continue
    seen.add(run.grid)
    config, problem = run_config(run)
    if config is not None:
      problem = attention_problem(config)
    if problem:
      raise UserError(
        f'--grid {sweep_grid.label(run.grid)} ({run.name}): {problem}'
      )


def checked_argv(argv: list[str], required: tuple, example: str) -> list:
  """The --config.* overrides of a command line (a sweep's, a probe's);
  one sentence for any other argument or a missing required flag."""
  extra = [a for a in argv[1:] if not OVERRIDE.match(a)]
  if extra:
    raise UserError(
      f'Unexpected argument {extra[0]!r}; config overrides are written '
      '--config.<key>=<value>.'
    )
  missing = [n for n in required if not flags.FLAGS[n].value]
  if missing:
    raise UserError(f'Give --{missing[0]}, e.g. {example}.')
  return [a for a in argv[1:] if OVERRIDE.match(a)]


def execute(runs, module: str, out: str | None = None) -> int | None:
  """--dry_run prints the runs (None); else runs them into `out` (default
  --out) and returns the sweep's exit status (a sweep's, a probe's command
  line)."""
  f = flags.FLAGS
  out = out or f.out
  retry = f['retry_diverged'].value if 'retry_diverged' in f else False
  if f.dry_run:
    probe = f['probe'].value if 'probe' in f else True
    seconds = f['probe_seconds'].value if 'probe_seconds' in f else 2.0
    dry_run(runs, f.bench, probe, seconds, out=out, retry_diverged=retry)
    return None
  if f.bench:
    raise UserError('--bench is read by --dry_run only; add --dry_run.')
  validate.check_dir(out, '--out')
  command = shlex.join(['python', '-m', module, *sys.argv[1:]])
  jobs = f['jobs'].value if 'jobs' in f else 1
  return Sweep(runs, out, command, jobs=jobs, retry_diverged=retry).run()


def sweep_parts(overrides: list[str]) -> list[sweep_spec.Part]:
  """The sweeps one command line asks for: its flags' one, or --sweep
  FILE.py:FN's parts with the flags laid over them (lra/sweep/spec.py)."""
  f = flags.FLAGS
  grid = sweep_grid.parse(f.grid, overrides)
  if not f.sweep:
    return [
      sweep_spec.Part(
        f.tasks, f.models, f.preset, grid, tuple(overrides), f.out
      )
    ]
  parts = sweep_spec.load(f.sweep)
  return [
    sweep_spec.merge(
      part,
      tasks=f.tasks,
      models=f.models,
      preset=f.preset if f['preset'].present else None,
      grid=grid,
      overrides=overrides,
      out=f.out,
      where=f.sweep + (f' part {i}' if len(parts) > 1 else ''),
    )
    for i, part in enumerate(parts, 1)
  ]


def main(argv: list[str]) -> None:
  f = flags.FLAGS
  try:
    overrides = checked_argv(
      argv,
      ('out',) if f.sweep else ('tasks', 'models', 'out'),
      f'{commands.program("sweep")} --tasks listops --models all --preset '
      'small --out runs/sweep',
    )
    planned = []
    for part in sweep_parts(overrides):
      runs = plan(
        part.tasks,
        part.models,
        part.preset,
        part.out,
        part.overrides,
        catalogue=catalogue(),
        grid=part.grid,
      )
      check_grid(runs)
      planned.append((part.out, runs))
    status = 0
    for i, (out, runs) in enumerate(planned, 1):
      if len(planned) > 1:
        print(f'Sweep {i} of {len(planned)}: {out}', flush=True)
      code = execute(runs, 'lra.sweep.main', out=out)
      if code == 130:
        sys.exit(code)
      status = max(status, code or 0)
    if not f.dry_run:
      sys.exit(status)
  except UserError as e:
    print(f'error: {e}', file=sys.stderr)
    sys.exit(2)


def run():
  """The command line (console script lra-sweep)."""
  define_flags()
  app.run(main, flags_parser=parse_flags)


if __name__ == '__main__':
  run()
