"""User-facing errors: one sentence, no stack trace.

In models/ so that models/ and lra/ can both raise UserError without models/
depending on the harness (lra.errors re-exports it).
"""


class UserError(Exception):
  """An error the user caused and can fix (missing data, bad flag, bad file).

  Entry points (train.py, eval.py, benchmark.py, `python -m lra.data.prepare`,
  `python -m lra.sweep`) catch it, print its message on one line and exit with
  status 2.
  """
