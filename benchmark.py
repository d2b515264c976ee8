r"""The LRA speed/memory table (Table 2), any config's training step, or one
attention layer alone.

  python benchmark.py --out runs/bench          # every model, 1K-4K
  python benchmark.py --layer --models transformer,local --out runs/layer

Every flag is in lra/bench/main.py (its docstring) and
docs/benchmarking.md, the measurement in lra/bench/measure.py; this file
is its entry point.
"""

from lra.train.interrupt import on_ctrl_c_exit

# Ctrl-C while the program loads: one line, exit 130 (importing this file
# sets nothing).
if __name__ == '__main__':
  on_ctrl_c_exit()

# The command line is lra/bench/main.py; this file is its entry point.
from lra.bench.main import run

if __name__ == '__main__':
  run()
