"""Trains an LRA model: `python train.py --config configs/<task>.py:<model>
[,<preset>] --workdir DIR [--config.<key>=<value> ...]`.

The code and every flag are in lra/train/main.py (its docstring); this file
is its entry point in a checkout (installed: lra-train).
"""

from lra.train.interrupt import on_ctrl_c_exit

# Ctrl-C while the program loads: one line, exit 130 (importing this file
# sets nothing).
if __name__ == '__main__':
  on_ctrl_c_exit()

from lra.train.main import run, train_and_evaluate  # noqa: F401

if __name__ == '__main__':
  run()
