"""`python -m lra.prepare`: the spelling kept from before the floors; the
module is lra/data/prepare.py (`python -m lra.data.prepare`, console script lra-prepare)."""

import sys

from lra.data.prepare import main

if __name__ == '__main__':
  sys.exit(main())
