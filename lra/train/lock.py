"""One training per workdir: an advisory lock on <workdir>/.lock.

fcntl.flock holds while the process lives and goes with it (a killed run
leaves no stale lock); the file records who holds it, so a second training
of the same workdir (or a sweep cell on it) refuses at once, naming the
other process. Process 0 of a multi-process run takes it for all of them.
"""

import contextlib
import errno
import os
import socket
import time

from lra.errors import UserError

try:
  import fcntl
except ImportError:  # not POSIX: no lock (the run is not stopped)
  fcntl = None

NAME = '.lock'


@contextlib.contextmanager
def workdir_lock(workdir: str, primary: bool = True):
  """Holds the workdir's lock for the block; UserError (one sentence) when
  another live process holds it. Creates the workdir."""
  if not primary or fcntl is None:
    yield
    return
  os.makedirs(workdir, exist_ok=True)
  path = os.path.join(workdir, NAME)
  fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
  try:
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
      if e.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
        raise
      holder = os.pread(fd, 512, 0).decode(errors='replace').strip()
      holder = holder or 'a running process'
      raise UserError(
        f'{workdir} is in use by another training ({holder}); wait for it '
        'to finish or stop it, or give another --workdir.'
      ) from None
    os.ftruncate(fd, 0)
    os.pwrite(
      fd,
      (
        f'process {os.getpid()} on {socket.gethostname()}, started '
        f'{time.strftime("%Y-%m-%d %H:%M:%S")}'
      ).encode(),
      0,
    )
    yield
  finally:
    os.close(fd)  # releases the lock
