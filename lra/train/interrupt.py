"""Ctrl-C before a program's own handling starts: one line, exit 130.

A program (train.py, eval.py, benchmark.py, scaling.py, their lra modules)
calls `on_ctrl_c_exit()` first, as __main__, before its heavy imports
(JAX, Flax): a Ctrl-C while they load prints `Interrupted.` and exits 130
with no traceback; SIGTERM and SIGHUP likewise print one line (with the
command to run again) and exit 143 and 129. The program's own handler
replaces it later (lra/train/cli.py run_main; a training run's,
lra/train/stops.py, which says what is kept). This module imports nothing
but the standard library, so it is set at once.
"""

import os
import shlex
import signal
import sys


def _command() -> str:
  """This process's command line as typed (a console script by its name,
  a module as `python -m`, a file as `python FILE`)."""
  argv0 = sys.argv[0] if sys.argv else ''
  spec = getattr(sys.modules.get('__main__'), '__spec__', None)
  if os.path.basename(argv0).startswith('lra-'):
    program = os.path.basename(argv0)
  elif spec is not None and spec.name:
    program = f'python -m {spec.name.removesuffix(".__main__")}'
  else:
    program = f'python {argv0}'
  return ' '.join([program, *(shlex.quote(a) for a in sys.argv[1:])])


def _exit(signum, frame):
  del frame
  if signum == signal.SIGINT:
    print('Interrupted.', file=sys.stderr)
  else:  # SIGTERM, SIGHUP (train.py's run has its own line, lra/train/stops.py)
    name = signal.Signals(signum).name
    print(
      f'Stopped ({name}). Run the same command again: {_command()}',
      file=sys.stderr,
    )
  os._exit(128 + signum)  # pylint: disable=protected-access


def on_ctrl_c_exit() -> None:
  """Ctrl-C (SIGINT) prints one line and exits 130 from now on; SIGTERM
  and SIGHUP (a preemption, a closed terminal) likewise, 143 and 129."""
  for s in (signal.SIGINT, signal.SIGTERM, getattr(signal, 'SIGHUP', None)):
    if s is not None:
      signal.signal(s, _exit)
