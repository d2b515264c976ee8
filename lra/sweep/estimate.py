"""A sweep's --dry_run (lra/sweep/main.py): each run's estimated training time,
from its own metrics.jsonl when it has trained before, else from
benchmark.py's steps/s at the nearest benchmarked length, scaled by a dense
Transformer's cost per step (step_cost), else from a short probe of its
compiled step (lra/sweep/probe.py: one per distinct config, seconds
each; --noprobe skips it). The first two count training steps only; a
probed estimate adds the measured compilation and evaluation and gives a
range from the fastest and slowest probed steps. Data generation is never
counted."""

from __future__ import annotations

import math
import os

from lra import data as tasks
from lra.errors import UserError
from lra.sweep.plan import Run, run_config
from lra.sweep.runner import (
  diverged_before,
  duration,
  earlier_entries,
  finished,
  measured_rate,
)
from lra.train import rundir

DEFAULT_BENCH = os.path.join('runs', 'bench', 'benchmark.json')


def _print(text):
  print(text, flush=True)


def load_benchmark(path: str | None) -> tuple | None:
  """(file, ok rows) of a benchmark.py output (a --out folder or its
  benchmark.json); the default file may be absent (then None)."""
  given = path is not None
  path = DEFAULT_BENCH if path is None else path
  if os.path.isdir(path):
    path = os.path.join(path, 'benchmark.json')
  if not os.path.exists(path):
    if given:
      raise UserError(
        f'--bench {path} does not exist; give a benchmark.py --out folder or '
        'its benchmark.json.'
      )
    return None
  rows = rundir.read_json(path)
  if not isinstance(rows, list):
    raise UserError(f'{path} is not a benchmark.py benchmark.json; rerun it.')
  return path, [r for r in rows if r.get('status') == 'ok']


def step_cost(
  batch: int, length: int, layers: int, emb: int, qkv: int, mlp: int
) -> int:
  """A dense Transformer's multiply-adds per training step, up to a constant
  factor: projections, feed-forward and exact attention per token."""
  return (
    batch * length * layers * (4 * emb * qkv + 2 * emb * mlp + 2 * length * qkv)
  )


def estimate(run: Run, config, bench: tuple | None) -> tuple:
  """(steps/s, where it comes from) for the run, or (None, why not)."""
  rate = measured_rate(run.workdir)
  if rate:
    return rate, 'measured in its workdir'
  if config is None:
    return None, 'its config does not parse'
  if bench is None:
    return None, 'no benchmark'
  m = config.model
  length = config.max_length + (1 if m.pooling == 'cls' else 0)
  length *= tasks.TASKS[config.task].num_inputs
  rows = [r for r in bench[1] if r['model'] == run.model]
  if not rows:
    return None, f'{run.model} is not in the benchmark'
  row = min(rows, key=lambda r: abs(math.log(r['sequence_length'] / length)))
  mc = row['model_config']
  cost = step_cost(
    row['batch_size'],
    row['sequence_length'],
    mc['num_layers'],
    mc['emb_dim'],
    mc['qkv_dim'],
    mc['mlp_dim'],
  )
  ours = step_cost(
    config.batch_size, length, m.num_layers, m.emb_dim, m.qkv_dim, m.mlp_dim
  )
  return (
    row['steps_per_sec'] * cost / ours,
    f'benchmark at length {row["length"]}, batch {row["batch_size"]}, scaled',
  )


def _first_line(e: Exception) -> str:
  lines = str(e).strip().splitlines()
  return (lines[0] if lines else type(e).__name__).rstrip('.')


def probed(run: Run, config, probes: dict, seconds: float) -> dict | str:
  """sweep_probe.estimate of the run from the probe of its config (made
  once per sweep_probe.shape_key, kept in `probes`), or why there is none."""
  from lra.sweep import probe as sweep_probe  # pylint: disable=g-import-not-at-top

  key = sweep_probe.shape_key(config)
  if key not in probes:
    try:
      probes[key] = sweep_probe.probe(config, seconds)
    except Exception as e:  # pylint: disable=broad-except
      probes[key] = f'the probe failed: {_first_line(e)}'
  found = probes[key]
  if isinstance(found, str):
    return found
  return sweep_probe.estimate(found, config, rundir.latest_step(run.workdir))


def probed_text(est: dict) -> str:
  """'about 4m 10s (3.6-5.2 min; 500 steps at ... probed: ...)'."""
  from lra.sweep.probe import minutes  # pylint: disable=g-import-not-at-top

  counted = (
    'compilation and evaluation'
    if est['evaluated']
    else 'compilation; evaluation not counted: split sizes unknown'
  )
  return (
    f'about {duration(est["seconds"])} ({minutes(est["low"])}-'
    f'{minutes(est["high"])} min; {est["steps"]} steps at {est["rate"]:.3g} '
    f'steps/s, probed here, + {duration(est["overhead"])} {counted})'
  )


def dry_run(
  runs: list[Run],
  bench_path: str | None,
  probe: bool = True,
  probe_seconds: float = 2.0,
  out: str | None = None,
  retry_diverged: bool = False,
) -> None:
  """Prints each run's command and estimated training time; writes nothing.
  A run with neither a measured rate nor a benchmark row is probed
  (`probe`: sweep_probe, about `probe_seconds` of steps after compiling).
  A run that diverged in an earlier sweep into `out` is shown as skipped,
  as the sweep would skip it (unless `retry_diverged`)."""
  earlier = {} if out is None or retry_diverged else earlier_entries(out)
  combos = {r.grid for r in runs}
  gridded = len(combos) > 1 and all(r.grid for r in runs)
  per = f' ({len(combos)} grid combinations each)' if gridded else ''
  _print(f'{len(runs)} run{"s" * (len(runs) != 1)} planned{per}.')
  bench = load_benchmark(bench_path)
  probing = (
    'timed by a short probe of its compiled training and evaluation steps '
    'on random data (once per distinct config, seconds each; --noprobe '
    'skips it)'
  )
  if bench is None:
    _print(
      f'No benchmark found ({DEFAULT_BENCH}; --bench DIR gives one): the '
      'time of a run that has not trained yet is '
      + (f'{probing}.' if probe else 'unknown.')
    )
  else:
    _print(
      f'Estimates from {bench[0]} (benchmark.py steps/s at the nearest '
      "length, scaled to each run's batch, length and width: rough) or from "
      "a run's own metrics.jsonl; training steps only."
      + (f' A model not in the benchmark is {probing}.' if probe else '')
    )
  total, unknown, skipped = 0.0, 0, 0
  low, high, probes, num_probed = 0.0, 0.0, {}, 0
  for i, run in enumerate(runs, 1):
    config, problem = run_config(run)
    head = f'[{i}/{len(runs)}] {run.name}:'
    if problem:
      _print(f'{head} would fail: {problem}')
      unknown += 1
    elif finished(run, config):
      _print(f'{head} finished, would be skipped')
      skipped += 1
    elif diverged_before(run, config, earlier.get(run.name)):
      _print(
        f'{head} diverged in an earlier sweep, would be skipped '
        '(--retry_diverged runs it again)'
      )
      skipped += 1
    else:
      left = config.num_train_steps - rundir.latest_step(run.workdir)
      rate, source = estimate(run, config, bench)
      est = None
      if not rate and probe:
        est = probed(run, config, probes, probe_seconds)
        if isinstance(est, str):
          source, est = est, None
      if rate:
        seconds = left / rate
        total, low, high = total + seconds, low + seconds, high + seconds
        _print(
          f'{head} about {duration(seconds)} ({left} steps at '
          f'{rate:.3g} steps/s; {source})'
        )
      elif est:
        total += est['seconds']
        low, high = low + est['low'], high + est['high']
        num_probed += 1
        _print(f'{head} {probed_text(est)}')
      else:
        unknown += 1
        _print(f'{head} {left} steps, time unknown ({source})')
    _print(f'  {run.command()}')
  counted = len(runs) - unknown - skipped
  tail = [f'{skipped} skipped'] if skipped else []
  tail += [f'{unknown} unknown'] if unknown else []
  tail += [f'{num_probed} probed'] if num_probed else []
  spread = ''
  if num_probed:
    from lra.sweep.probe import minutes  # pylint: disable=g-import-not-at-top

    spread = f' ({minutes(low)}-{minutes(high)} min)'
  _print(
    f'Total: about {duration(total)}{spread} for {counted} '
    f'run{"s" * (counted != 1)}'
    + (f' ({", ".join(tail)})' if tail else '')
    + '.'
  )
