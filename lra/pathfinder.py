"""`python -m lra.pathfinder`: the Pathfinder tool of lra/tasks/pathfinder.py.

  python -m lra.pathfinder --examples docs/pathfinder_examples.png
  python -m lra.pathfinder --rate 32                # images/s of this CPU
  python -m lra.pathfinder --stats --difficulty easy

A command-line alias only, so the documented spelling keeps working; code
imports lra.tasks.pathfinder.
"""

import sys

from lra.tasks.pathfinder import main

if __name__ == '__main__':
  sys.exit(main())
