"""`python -m lra.devicecheck`: the spelling kept from before the floors; the
module is lra/lab/devicecheck.py (`python -m lra.lab.devicecheck`, console script lra-devicecheck)."""

from lra.lab.devicecheck import cli

if __name__ == '__main__':
  cli()
