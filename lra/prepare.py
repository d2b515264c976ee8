"""`python -m lra.prepare`: the spelling kept from before the floors; the
module is lra/data/prepare.py (`python -m lra.data.prepare`, console script lra-prepare)."""

from lra.data.prepare import run

if __name__ == '__main__':
  run()
