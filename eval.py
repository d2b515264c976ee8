"""Evaluates a checkpoint (`python eval.py --workdir DIR [--split test]
[--step N]`), or prints the accuracy table of many runs (`--table DIR`).

The code and every flag are in lra/report/eval_main.py (its docstring);
this file is its entry point in a checkout (installed: lra-eval).
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

from lra.report.eval_main import run

if __name__ == '__main__':
  run()
