"""Batches prepared and transferred ahead of the step that uses them.

The training loop's host work (drawing the rows of (seed, step), cropping,
the objective's inputs) and the host-to-device transfer run on a worker
thread, `depth` steps ahead, while the device computes: the loop only takes
the next ready batch. Batches are pure functions of the step (lra/train/batching.py
draws them from (seed, step)), so prefetching changes no number: a run with
it is bit-identical to one without. An error in the worker (a damaged cache,
a bad option) is raised in the loop at the step that needed that batch.

Depth 0 makes each batch in the loop's own thread when the loop asks for
it. On a CPU that is the faster choice (train.py's default there): the
step's dispatch holds Python's GIL, so a worker thread's batch work
interleaves with it rather than overlapping, and JAX's asynchronous
dispatch already prepares batch s + 1 while step s computes.
"""

import queue
import threading
from typing import Callable, Iterator

_DONE = object()


class Prefetcher:
  """Iterates make(step) for step in steps, `depth` ahead on a thread
  (depth 0: made in the caller's thread when it asks, no worker).

  make: step -> the step's batch (host work and transfer both).
  Use as a context manager (or call close()) so the worker stops when the
  loop ends early (Ctrl-C, an error).
  """

  def __init__(self, make: Callable, steps: range, depth: int = 2):
    self._make = make
    self._steps = steps
    self._thread = None
    if depth <= 0:
      return
    self._queue = queue.Queue(maxsize=max(depth, 1))
    self._stop = threading.Event()
    self._thread = threading.Thread(
      target=self._work, name='lra-prefetch', daemon=True
    )
    self._thread.start()

  def _put(self, item) -> bool:
    """Puts item unless asked to stop; False when stopped."""
    while not self._stop.is_set():
      try:
        self._queue.put(item, timeout=0.1)
        return True
      except queue.Full:
        continue
    return False

  def _work(self) -> None:
    try:
      for step in self._steps:
        if not self._put((step, self._make(step), None)):
          return
    except BaseException as e:  # pylint: disable=broad-except
      self._put((None, None, e))
      return
    self._put((None, _DONE, None))

  def __iter__(self) -> Iterator:
    """Yields (step, batch) in order; raises the worker's error."""
    if self._thread is None:
      for step in self._steps:
        yield step, self._make(step)
      return
    while True:
      step, batch, error = self._queue.get()
      if error is not None:
        raise error
      if batch is _DONE:
        return
      yield step, batch

  def close(self) -> None:
    if self._thread is None:
      return
    self._stop.set()
    self._thread.join(timeout=10)

  def __enter__(self) -> 'Prefetcher':
    return self

  def __exit__(self, *exc) -> None:
    self.close()
