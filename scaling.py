"""Compiled memory and compile time of one training step under the memory
tools: `python scaling.py [--config configs/text.py:transformer]
[--length 4096] [--batch 4] [--accum 4] [--layers 0]`.

The code and every flag are in lra/bench/scaling.py (its docstring); this
file is its entry point in a checkout (installed: lra-scaling).
"""

from lra.train.interrupt import on_ctrl_c_exit

# Ctrl-C while the program loads: one line, exit 130 (importing this file
# sets nothing).
if __name__ == '__main__':
  on_ctrl_c_exit()

from lra.bench.scaling import run

if __name__ == '__main__':
  run()
