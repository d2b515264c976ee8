"""A sweep's grid (lra/sweep/main.py --grid): config values tried per (task,
model), and the tuned table that reports the best of them on validation.

  --grid learning_rate=1e-3,3e-3,1e-2 --grid model.emb_dim=32,64

is the cross product of the values of every --grid (here 3 x 2 = 6
combinations, in the order given, the last key varying fastest). Each
combination of each (task, model) trains in its own workdir,
OUT/<task>/<model>[-<preset>]/<key>=<value>[,<key>=<value>...], with
--config.<key>=<value> appended to its train.py command. A value that
itself holds a comma (a list option) cannot be gridded: sweep it with
separate sweeps.

The tuned table (OUT/tuned.md) has one row per (task, model, preset): the
combination of best validation accuracy (ties: the lower validation loss,
then the first in grid order), its test accuracy (the run's selected one,
lra/train/rundir.py) and its extra test splits, and every combination's
validation accuracy beside it, so the grid it was picked from is on the
row. A (task, model) whose runs have not all finished is marked
`partial`: its best so far, of the finished ones.

Seeds: `--grid seed=0,1` trains every combination with each seed; the
choice is then the combination of best *mean* validation accuracy over its
finished seeds (not the luckiest seed), and its reported accuracies are
the means, with the seeds' range beside them (`seed_count`,
`val_range`, `test_range` in the chosen entry; each seed's own entry in
`seed_runs`).
"""

from __future__ import annotations

import itertools

from lra.errors import NON_FINITE_STOP, UserError

GRID_EXAMPLE = '--grid learning_rate=1e-3,3e-3,1e-2'


def parse(specs: list[str] | tuple, overrides=()) -> tuple:
  """--grid flags -> ((key, (value, ...)), ...); one sentence when a flag
  is malformed, names a key twice or a key --config.* also sets."""
  out = []
  for spec in specs or ():
    key, sep, values = spec.partition('=')
    key = key.strip().removeprefix('--').removeprefix('config.')
    items = tuple(v.strip() for v in values.split(','))
    if not sep or not key or not all(items):
      raise UserError(
        f'--grid {spec!r} is not key=value,value,...; write e.g. '
        f'{GRID_EXAMPLE} (one --grid per key).'
      )
    if key in (k for k, _ in out):
      raise UserError(
        f'--grid names {key} twice; give each key once, its values joined '
        f'by commas ({GRID_EXAMPLE}).'
      )
    if len(set(items)) < len(items):
      raise UserError(f'--grid {spec!r} lists a value twice; list each once.')
    out.append((key, items))
  for arg in overrides:
    key = arg.lstrip('-').removeprefix('no').removeprefix('config.')
    key = key.split('=', 1)[0]
    if key in (k for k, _ in out):
      raise UserError(
        f'{key} is set by both --grid and {arg}; drop one of them.'
      )
  return tuple(out)


def combinations(grid: tuple) -> list[tuple]:
  """[((key, value), ...), ...]: the cross product, in the order given;
  [()] (one run, no grid) for an empty grid."""
  if not grid:
    return [()]
  keys = [k for k, _ in grid]
  return [
    tuple(zip(keys, values))
    for values in itertools.product(*(v for _, v in grid))
  ]


def label(combination: tuple) -> str:
  """'learning_rate=1e-3,model.emb_dim=32': the workdir's last part."""
  return ','.join(f'{k}={v}' for k, v in combination)


def _percent(x):
  return '-' if x is None else f'{100 * x:.2f}%'


def _rank(entry):
  """Sort key, best first: validation accuracy, then loss."""
  acc = entry.get('val_accuracy')
  loss = entry.get('val_loss')
  return (
    -(acc if acc is not None else -1.0),
    loss if loss is not None else float('inf'),
  )


SEED = 'seed'


def _mean(values):
  values = [v for v in values if v is not None]
  return sum(values) / len(values) if values else None


def _range(values):
  values = [v for v in values if v is not None]
  return (min(values), max(values)) if values else None


def over_seeds(runs: list[dict]) -> dict:
  """One entry for the finished runs of one combination that differ only
  in their seed: the first run's fields, its accuracies and losses the
  seeds' means, with seed_count, val_range, test_range, seed_runs."""
  first = runs[0]
  merged = dict(first)
  for key in ('val_accuracy', 'val_loss', 'test_accuracy', 'test_loss'):
    merged[key] = _mean([r.get(key) for r in runs])
  names = dict.fromkeys(n for r in runs for n in (r.get('test_splits') or {}))
  merged['test_splits'] = {
    n: _mean([(r.get('test_splits') or {}).get(n) for r in runs]) for n in names
  } or first.get('test_splits')
  merged['grid'] = {
    k: v for k, v in (first.get('grid') or {}).items() if k != SEED
  }
  merged.update(
    seed_count=len(runs),
    val_range=_range([r.get('val_accuracy') for r in runs]),
    test_range=_range([r.get('test_accuracy') for r in runs]),
    seed_runs=runs,
  )
  return merged


def best_of(entries: list[dict]) -> dict | None:
  """The entry of best validation accuracy among finished ones (ties: the
  lower validation loss, then the first); None when none has finished.
  With a seed in the grid: the combination of best mean over its seeds
  (over_seeds)."""
  done = [
    e
    for e in entries
    if e.get('status') in ('done', 'skipped')
    and e.get('val_accuracy') is not None
  ]
  if not done:
    return None
  if any(SEED in (e.get('grid') or {}) for e in done):
    combos = {}
    for e in done:
      rest = tuple(
        (k, v) for k, v in (e.get('grid') or {}).items() if k != SEED
      )
      combos.setdefault(rest, []).append(e)
    done = [over_seeds(runs) for runs in combos.values()]
    return min(done, key=lambda e: (_rank(e), done.index(e)))
  return min(done, key=lambda e: (_rank(e), entries.index(e)))


def groups(entries: list[dict]) -> dict:
  """{(task, model, preset): [entries of its grid, in sweep order]} for the
  entries that ran with a grid (sweep.json `grid`)."""
  out = {}
  for e in entries:
    if e.get('grid') is None:
      continue
    out.setdefault((e['task'], e['model'], e.get('preset') or ''), []).append(e)
  return out


def tuned_rows(entries: list[dict]) -> list[dict]:
  """One dict per (task, model, preset) with a grid: best (its entry, or
  None), runs (every entry), complete (every run finished or diverged: a
  diverged combination was tried, and Zoology-style grids count it as a
  failed point, not a missing one), diverged (how many)."""
  rows = []
  for (task, model, preset), runs in groups(entries).items():
    rows.append(
      dict(
        task=task,
        model=model,
        preset=preset,
        best=best_of(runs),
        runs=runs,
        complete=all(
          r.get('status') in ('done', 'skipped') or diverged(r) for r in runs
        ),
        diverged=sum(diverged(r) for r in runs),
      )
    )
  return rows


def diverged(entry: dict) -> bool:
  """Whether a sweep run failed because its loss, gradient or parameters
  went non-finite (train.py stops such a run with NON_FINITE_STOP's
  sentence, which the sweep records as its message)."""
  return entry.get('status') == 'failed' and NON_FINITE_STOP in (
    entry.get('message') or ''
  )


def with_range(value, entry, key):
  """'97.10%', or with seeds '97.10% (96.80-97.40%, 2 seeds)'."""
  spread = entry.get(key)
  if not spread or entry.get('seed_count', 1) < 2:
    return _percent(value)
  low, high = spread
  return (
    f'{_percent(value)} ({100 * low:.2f}-{100 * high:.2f}%, '
    f'{entry["seed_count"]} seeds)'
  )


def _tried(entry):
  """'learning_rate=1e-3: 97.10%' (or the run's status when unfinished)."""
  done = entry.get('status') in ('done', 'skipped')
  result = (
    _percent(entry.get('val_accuracy'))
    if done
    else 'diverged'
    if diverged(entry)
    else entry.get('status')
  )
  return f'{label(tuple((entry.get("grid") or {}).items()))}: {result}'


def tuned_markdown(entries: list[dict]) -> str:
  """OUT/tuned.md: per (task, model, preset), the best combination on
  validation, its test accuracy and extra test splits, and the grid."""
  rows = tuned_rows(entries)
  split_names = list(
    dict.fromkeys(
      name
      for r in rows
      if r['best']
      for name in (r['best'].get('test_splits') or {})
    )
  )
  head = ['task', 'model', 'preset', 'best on val', 'val', 'test']
  head += [f'test {n}' for n in split_names]
  head += ['grid (val accuracy)']
  lines = ['| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
  for r in rows:
    best = r['best'] or {}
    splits = best.get('test_splits') or {}
    choice = label(tuple((best.get('grid') or {}).items())) if best else '-'
    if not r['complete']:
      choice += ' (partial)'
    tried = ', '.join(_tried(e) for e in r['runs'])
    cells = [
      r['task'],
      f'`{r["model"]}`',
      r['preset'] or '-',
      choice,
      with_range(best.get('val_accuracy'), best, 'val_range'),
      with_range(best.get('test_accuracy'), best, 'test_range'),
      *(_percent(splits.get(n)) for n in split_names),
      tried,
    ]
    lines.append('| ' + ' | '.join(cells) + ' |')
  return '\n'.join(lines)
