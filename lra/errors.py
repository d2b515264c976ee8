"""User-facing errors: one sentence, no stack trace.

UserError lives in models/errors.py, which models/ imports too (models/
never imports lra/); this module re-exports it so the harness and its users
keep writing `from lra.errors import UserError`.
"""

from models.errors import UserError

__all__ = ['UserError']
