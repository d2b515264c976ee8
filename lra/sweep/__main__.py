"""`python -m lra.sweep`: the sweep's command line (lra/sweep/main.py)."""

from lra.sweep.main import run

run()
