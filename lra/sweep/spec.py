r"""A sweep written as a Python file (lra/sweep/main.py --sweep FILE.py:FN).

  python -m lra.sweep --sweep experiments/mqar/sweeps.py:width_grid \
      --out runs/mqar [--models transformer] [--grid ...] [--config.*=...]

FN, a function of FILE called with no arguments, returns one part or a
list of parts; a part is a dict of what the flags give one sweep:

  tasks    'mqar' or ['listops', 'text'] (the --tasks grammar: 'all', '-x')
  models   the same, for --models
  preset   'small', 'zoology', ... ('' or 'none': the reference; default '')
  grid     {'model.emb_dim': [128, 64, 32], 'learning_rate': ['1e-3', ...]}
           (--grid axes in this order: the last varies fastest)
  config   {'data.seq_len': 128, ...}: --config.<key>=<value> for every run
  out      a folder below --out for this part (default: --out itself)

As zoology's experiments/paper_configs and big_vision's `file.py:arg`
configs do, the settings of a study live in a file beside it, not in a
README's shell commands. Values are written into train.py's command line
as text (True / False as true / false); give a number as a string
('3.2e-2') to choose how it is spelt, since the spelling names the run's
workdir (`learning_rate=3.2e-2`) and a sweep skips only the runs it finds
under the same name.

The command line wins over the file: --tasks, --models and --preset
replace the file's value in every part; --grid adds an axis or replaces
the file's values of that key; --config.<key>=<value> adds an override or
replaces the file's value of that key (a key the file grids and the
command line sets, or the other way round, takes the command line's).
A list of parts runs as that many sweeps, one after the other, each into
its own `out` with its own sweep.json (as the shell commands it replaces;
parts may share an `out`: a sweep keeps the entries of earlier ones).
Several presets, or settings that differ by model, are several parts.
The parts are all planned, and checked, before the first one runs.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import sys

from lra.errors import UserError
from lra.sweep import grid as sweep_grid
from lra.sweep.plan import OVERRIDE

KEYS = ('tasks', 'models', 'preset', 'grid', 'config', 'out')
EXAMPLE = 'experiments/mqar/sweeps.py:width_grid'


@dataclasses.dataclass(frozen=True)
class Part:
  """One sweep of a sweep file, merged with the command line: the
  arguments of plan (lra/sweep/plan.py) and the folder it runs into."""

  tasks: str
  models: str
  preset: str
  grid: tuple  # sweep_grid.parse's ((key, (value, ...)), ...)
  overrides: tuple  # --config.<key>=<value> arguments
  out: str


def text(value) -> str:
  """A value as train.py's command line spells it."""
  if isinstance(value, bool):
    return 'true' if value else 'false'
  return str(value)


def load(ref: str) -> list[dict]:
  """FILE.py:FN -> FN()'s parts, each a dict of KEYS; one sentence when the
  file cannot be read, FN is missing or not a function, or what it returns
  is not a part or a list of parts."""
  path, sep, name = ref.rpartition(':')
  if not sep or not path or not name:
    raise UserError(
      f'--sweep {ref!r} is not FILE.py:FN; write e.g. --sweep {EXAMPLE}.'
    )
  if not path.endswith('.py') or not os.path.isfile(path):
    raise UserError(
      f'--sweep: {path} is not a Python file; give FILE.py:FN, e.g. '
      f'--sweep {EXAMPLE}.'
    )
  module_name = '_lra_sweep_' + os.path.splitext(os.path.basename(path))[0]
  spec = importlib.util.spec_from_file_location(module_name, path)
  module = importlib.util.module_from_spec(spec)
  sys.modules[module_name] = module  # as an import would (dataclasses)
  try:
    spec.loader.exec_module(module)
  except Exception as e:  # pylint: disable=broad-except
    raise UserError(
      f'--sweep: {path} failed to load ({type(e).__name__}: '
      f'{_first_line(e)}); fix the file.'
    ) from e
  fn = getattr(module, name, None)
  if not callable(fn):
    found = sorted(
      n
      for n, v in vars(module).items()
      if callable(v)
      and not n.startswith('_')
      and getattr(v, '__module__', None) == module_name
    )
    raise UserError(
      f'--sweep: {path} has no function {name!r}; it has: '
      f'{", ".join(found) or "none"}.'
    )
  try:
    parts = fn()
  except Exception as e:  # pylint: disable=broad-except
    raise UserError(
      f'--sweep: {ref} raised {type(e).__name__}: {_first_line(e)}.'
    ) from e
  if isinstance(parts, dict):
    parts = [parts]
  if not isinstance(parts, (list, tuple)) or not parts:
    raise UserError(
      f'--sweep: {ref} returned {type(parts).__name__}; return a dict of '
      f'{", ".join(KEYS)} or a non-empty list of such dicts.'
    )
  for i, part in enumerate(parts):
    _check_part(part, f'{ref}' + (f' part {i + 1}' if len(parts) > 1 else ''))
  return list(parts)


def _first_line(e: Exception) -> str:
  return (str(e).strip().splitlines() or [''])[0]


def _names(value) -> bool:
  return isinstance(value, str) or (
    isinstance(value, (list, tuple))
    and value
    and all(isinstance(v, str) for v in value)
  )


def _check_part(part, where: str) -> None:
  """One sentence for a part of the wrong shape."""
  if not isinstance(part, dict):
    raise UserError(
      f'--sweep: {where} is a {type(part).__name__}; each part is a dict '
      f'of {", ".join(KEYS)}.'
    )
  unknown = [k for k in part if k not in KEYS]
  if unknown:
    raise UserError(
      f'--sweep: {where} has the unknown key {unknown[0]!r}; valid: '
      f'{", ".join(KEYS)}.'
    )
  for key in ('tasks', 'models'):
    if key in part and not _names(part[key]):
      raise UserError(
        f'--sweep: {where}: {key} must be a string or a list of strings, '
        f'not {part[key]!r}.'
      )
  for key in ('preset', 'out'):
    if part.get(key) is not None and not isinstance(part[key], str):
      raise UserError(
        f'--sweep: {where}: {key} must be a string, not {part[key]!r}.'
      )
  out = part.get('out') or ''
  if os.path.isabs(out) or '..' in out.split(os.sep):
    raise UserError(
      f'--sweep: {where}: out {out!r} must be a folder below --out '
      "(relative, without '..')."
    )
  for key in ('grid', 'config'):
    if not isinstance(part.get(key, {}), dict):
      raise UserError(
        f'--sweep: {where}: {key} must be a dict of config key -> '
        f'{"values" if key == "grid" else "value"}, not '
        f'{type(part[key]).__name__}.'
      )
  for key, values in part.get('grid', {}).items():
    values = values if isinstance(values, (list, tuple)) else [values]
    bad = [v for v in values if not text(v) or ',' in text(v)]
    if not values or bad:
      raise UserError(
        f'--sweep: {where}: grid {key} needs one or more values without '
        f'commas, not {part["grid"][key]!r}.'
      )


def _key(arg: str) -> str:
  return OVERRIDE.sub('', arg).split('=', 1)[0]


def _bare(key: str) -> str:
  """A file's config key as the command line's: 'config.seed' -> 'seed'."""
  return key.removeprefix('--').removeprefix('config.')


def merge(
  part: dict,
  *,
  tasks: str | None,
  models: str | None,
  preset: str | None,
  grid: tuple,
  overrides: list,
  out: str,
  where: str,
) -> Part:
  """A file's part with the command line's flags (None / empty: not given)
  laid over it, by the rule of the module docstring."""
  names = {}
  for key, flag in (('tasks', tasks), ('models', models)):
    value = flag if flag is not None else part.get(key)
    if value is None:
      raise UserError(
        f'--sweep: {where} gives no {key}; add {key} to it or give --{key}.'
      )
    names[key] = value if isinstance(value, str) else ','.join(value)
  cli_grid = dict(grid)
  cli_keys = {_key(a) for a in overrides}
  axes = {
    _bare(key): tuple(
      text(v)
      for v in (values if isinstance(values, (list, tuple)) else [values])
    )
    for key, values in part.get('grid', {}).items()
  }
  axes.update(cli_grid)
  axes = {k: v for k, v in axes.items() if k in cli_grid or k not in cli_keys}
  config = [
    f'--config.{_bare(key)}={text(value)}'
    for key, value in part.get('config', {}).items()
    if _bare(key) not in cli_keys and _bare(key) not in cli_grid
  ]
  config += list(overrides)
  specs = [f'{key}={",".join(values)}' for key, values in axes.items()]
  return Part(
    tasks=names['tasks'],
    models=names['models'],
    preset=preset if preset is not None else (part.get('preset') or ''),
    grid=sweep_grid.parse(specs, config),
    overrides=tuple(config),
    out=os.path.join(out, part['out']) if part.get('out') else out,
  )
