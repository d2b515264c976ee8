"""User-facing errors: one sentence, no stack trace.

UserError lives in models/errors.py, which models/ imports too (models/
never imports lra/); this module re-exports it so the harness and its users
keep writing `from lra.errors import UserError`.
"""

from models.errors import UserError

# How the sentence of a run stopped by a non-finite loss, gradient or
# parameter norm begins (lra/train/loop.py non_finite_error); a sweep's
# record of a failed run (sweep.json `message`) is read by it to tell a
# diverged learning rate from a crash (lra/sweep/grid.py diverged:
# the tuned tables, and a rerun's skip in lra/sweep/runner.py).
NON_FINITE_STOP = 'Training stopped: '

__all__ = ['NON_FINITE_STOP', 'UserError']
