"""Directory checks before anything is written: one sentence when a path
cannot be a directory this process may use (lra.train.validate re-exports
check_dir for the training floor)."""

import os

from lra.errors import UserError


def _name_max(existing):
  try:
    return os.pathconf(existing, 'PC_NAME_MAX')
  except (OSError, ValueError):
    return 255


def check_dir(path, flag, writable=True):
  """Raises UserError unless `path` is, or can be made, a directory (and,
  with `writable`, one this process can write in). Creates nothing."""
  if not path:
    raise UserError(f'{flag} is empty; give a directory, e.g. {flag}=runs/x.')
  full = os.path.abspath(os.path.expanduser(path))
  if os.path.exists(full) and not os.path.isdir(full):
    raise UserError(
      f'{flag} {path} is a file, not a directory; give a directory path.'
    )
  parent = full
  while not os.path.exists(parent):
    parent = os.path.dirname(parent)
  if not os.path.isdir(parent):
    raise UserError(
      f'{flag} {path} cannot be created: {parent} is a file, not a '
      'directory; give another path.'
    )
  limit = _name_max(parent)
  long = [p for p in full.split(os.sep) if len(p.encode()) > limit]
  if long:
    raise UserError(
      f'{flag} has a name of {len(long[0].encode())} bytes '
      f'({long[0][:20]}...), over the {limit} this file system allows; use '
      'a shorter name.'
    )
  if writable and not os.access(parent, os.W_OK | os.X_OK):
    raise UserError(
      f'{flag} {path} is not writable ({parent} does not allow it); give a '
      'directory you can write to.'
    )
