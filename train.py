"""Trains an LRA model: `python train.py --config configs/<task>.py:<model>
[,<preset>] --workdir DIR [--config.<key>=<value> ...]`.

The code and every flag are in lra/train/main.py (its docstring); this file
is its entry point in a checkout (installed: lra-train).
"""

import os
import signal
import sys

# Ctrl-C before the entry point's own handling starts (imports, start-up):
# one line, exit 130, no traceback (run as a script; importing it sets
# nothing).
if __name__ == '__main__':
  signal.signal(
    signal.SIGINT,
    lambda *_: (print('Interrupted.', file=sys.stderr), os._exit(130)),
  )

from lra.train.main import run, train_and_evaluate  # noqa: F401

if __name__ == '__main__':
  run()
