"""`python -m lra.sweep`: the spelling kept from before the floors; the
module is lra/lab/sweep.py (`python -m lra.lab.sweep`, console script lra-sweep)."""

from lra.lab.sweep import run

if __name__ == '__main__':
  run()
