"""`python -m lra.devicecheck`: the spelling kept from before the floors; the
module is lra/lab/devicecheck.py (`python -m lra.lab.devicecheck`, console script lra-devicecheck)."""

import sys

from lra.lab.devicecheck import main

if __name__ == '__main__':
  sys.exit(main())
