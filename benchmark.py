r"""The LRA speed/memory table (Table 2), any config's training step, or one
attention layer alone.

  python benchmark.py --out runs/bench          # every model, 1K-4K
  python benchmark.py --layer --models transformer,local --out runs/layer

The measurement code and every flag are in lra/bench/main.py (its
docstring) and docs/benchmarking.md; this file is its entry point.
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

# The measurement code is lra/bench/main.py; this file is its entry point.
from lra.bench.main import run

if __name__ == '__main__':
  run()
