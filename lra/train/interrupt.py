"""Ctrl-C before a program's own handling starts: one line, exit 130.

A program (train.py, eval.py, benchmark.py, scaling.py, their lra modules)
calls `on_ctrl_c_exit()` first, as __main__, before its heavy imports
(JAX, Flax): a Ctrl-C while they load prints `Interrupted.` and exits 130
with no traceback. The program's own handler replaces it later
(lra/train/cli.py run_main; the training loop's, which saves first). This
module imports nothing but the standard library, so it is set at once.
"""

import os
import signal
import sys


def _exit(*_):
  print('Interrupted.', file=sys.stderr)
  os._exit(130)  # pylint: disable=protected-access


def on_ctrl_c_exit() -> None:
  """Ctrl-C (SIGINT) prints one line and exits 130 from now on."""
  signal.signal(signal.SIGINT, _exit)
