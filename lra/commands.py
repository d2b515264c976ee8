"""The commands the programs print in their hints, spelt to work where the
program was started.

A hint such as `curves: python eval.py --plot DIR` works only in a checkout
of the repository (its shims eval.py, train.py, benchmark.py and the `lra`
package beside them); after `pip install .` in another directory it is
`lra-eval --plot DIR`. `program('eval')` picks the spelling from how this
process was started:

  started as a console script (lra-train, ...)  the console script (lra-eval)
  the working directory is a checkout           python eval.py,
                                                python -m lra.sweep
  a shim run by path from another directory     python ../lra/eval.py
  anything else (an installed package)          the console script

Every printed command goes through it; nothing else guesses.
"""

import os
import shlex
import sys

# program: (console script, its form in a checkout: a shim's file name, or
# `-m module` for a program that has no shim).
PROGRAMS = {
  'train': ('lra-train', 'train.py'),
  'eval': ('lra-eval', 'eval.py'),
  'benchmark': ('lra-benchmark', 'benchmark.py'),
  'prepare': ('lra-prepare', '-m lra.data.prepare'),
  'sweep': ('lra-sweep', '-m lra.sweep'),
}


def _is_checkout(folder: str) -> bool:
  """A folder that holds the repository's `lra` package and its shims."""
  return os.path.isfile(
    os.path.join(folder, 'lra', '__init__.py')
  ) and os.path.isfile(os.path.join(folder, 'train.py'))


def program(name: str, argv0: str | None = None, cwd: str | None = None) -> str:
  """How to start program `name` (a key of PROGRAMS) from the working
  directory of this process: 'lra-eval', 'python eval.py',
  'python ../lra/eval.py' or 'python -m lra.sweep'. argv0 and cwd default
  to this process's sys.argv[0] and working directory."""
  console, local = PROGRAMS[name]
  argv0 = sys.argv[0] if argv0 is None else argv0
  cwd = os.getcwd() if cwd is None else cwd
  if os.path.basename(argv0).startswith('lra-'):
    return console
  if _is_checkout(cwd):
    return f'python {local}'
  started_in = os.path.dirname(os.path.abspath(os.path.join(cwd, argv0)))
  if argv0.endswith('.py') and _is_checkout(started_in):
    if local.startswith('-m '):  # python -m needs the checkout on sys.path
      return console
    return f'python {os.path.relpath(os.path.join(started_in, local), cwd)}'
  return console


def command(name: str, *args: str) -> str:
  """program(name) followed by args (strings or paths), each quoted for a
  POSIX shell where it needs it: command('eval', '--plot', workdir)."""
  return ' '.join([program(name), *(shlex.quote(str(a)) for a in args)])
