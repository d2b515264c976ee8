"""lra.data.cache.preparing: one process prepares a cache at a time; the
other waits (saying so once), then goes on; the lock file goes with its
holder."""

import os
import select
import subprocess
import sys
import time

from lra.data import cache

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Inside its block the waiter reports whether the lock file it holds is
# the one at the path (the holder removed the old one as it let go: a lock
# on a removed file would exclude nobody).
WAITER = (
  'import os, sys; from lra.data import cache\n'
  'with cache.preparing(sys.argv[1]):\n'
  '  print("got it", os.path.exists(sys.argv[1] + ".lock"), flush=True)\n'
)


def test_a_second_process_waits_for_the_first(tmp_path):
  target = str(tmp_path / 'task' / 'small')
  with cache.preparing(target, say=False):
    assert os.path.exists(target + '.lock')
    waiter = subprocess.Popen(
      [sys.executable, '-c', WAITER, target],
      cwd=ROOT,
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      text=True,
    )
    # Until the waiter says it waits (it found the lock held).
    said, deadline = '', time.monotonic() + 120
    while 'Waiting' not in said and time.monotonic() < deadline:
      ready, _, _ = select.select([waiter.stderr], [], [], 1.0)
      if ready:
        said += waiter.stderr.readline()
    assert 'Waiting for another process preparing' in said, said
    time.sleep(0.5)
    assert waiter.poll() is None  # still blocked while the lock is held
  out, err = waiter.communicate(timeout=60)
  assert waiter.returncode == 0, said + err
  assert out.strip() == 'got it True'
  assert not os.path.exists(target + '.lock')
