"""User-facing errors: one sentence, no stack trace."""


class UserError(Exception):
  """An error the user caused and can fix (missing data, bad flag, bad file).

  Entry points (train.py, eval.py, benchmark.py, `python -m lra.prepare`) catch
  it, print its message on one line and exit with status 2.
  """
