"""How a program of the project starts another one: `sys.executable -m
lra....`, never a file found relative to a module, so it works the same
from a checkout and from an installed wheel.

The child gets this process's import root first on PYTHONPATH (the entry
of sys.path that holds the `lra` package: a checkout a shim was run from,
`python ~/lra/benchmark.py` from another directory, or site-packages), so
it imports the same lra, models and configs as its parent.
"""

import os
import sys


def command(module: str, *args: str) -> list[str]:
  """The argv that runs `python -m module args...` with this interpreter."""
  return [sys.executable, '-m', module, *args]


def import_root() -> str | None:
  """The entry of sys.path this process imports `lra` from, or None."""
  for entry in sys.path:
    folder = os.path.abspath(entry or os.curdir)
    if os.path.isfile(os.path.join(folder, 'lra', '__init__.py')):
      return folder
  return None


def env(base: dict | None = None) -> dict:
  """`base` (default os.environ) with import_root() first on PYTHONPATH."""
  out = dict(os.environ if base is None else base)
  paths = [import_root(), *out.get('PYTHONPATH', '').split(os.pathsep)]
  out['PYTHONPATH'] = os.pathsep.join(dict.fromkeys(p for p in paths if p))
  return out
