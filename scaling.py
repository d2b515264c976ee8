"""Compiled memory and compile time of one training step under the memory
tools: `python scaling.py [--config configs/text.py:transformer]
[--length 4096] [--batch 4] [--accum 4] [--layers 0]`.

The code and every flag are in lra/bench/scaling.py (its docstring); this
file is its entry point in a checkout (installed: lra-scaling).
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

from lra.bench.scaling import run

if __name__ == '__main__':
  run()
