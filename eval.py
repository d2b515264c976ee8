"""Evaluates a checkpoint (`python eval.py --workdir DIR [--split test]
[--step N]`), or prints the accuracy table of many runs (`--table DIR`).

The code and every flag are in lra/report/eval_main.py (its docstring);
this file is its entry point in a checkout (installed: lra-eval).
"""

from lra.train.interrupt import on_ctrl_c_exit

# Ctrl-C while the program loads: one line, exit 130 (importing this file
# sets nothing).
if __name__ == '__main__':
  on_ctrl_c_exit()

from lra.report.eval_main import run

if __name__ == '__main__':
  run()
