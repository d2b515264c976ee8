"""Batches prepared and transferred ahead of the step that uses them.

The training loop's host work (drawing the rows of (seed, step), cropping,
the objective's inputs) and the host-to-device transfer run on a worker
thread, `depth` steps ahead, while the device computes: the loop only takes
the next ready batch. Batches are pure functions of the step
(lra/train/batching.py draws them from (seed, step)), so prefetching
changes no number: a run with
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

import jax
from ml_collections import ConfigDict

from lra import data as tasks
from lra.train import batching, runtime

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


def prefetched(
  config: ConfigDict,
  task: tasks.Task,
  data: dict,
  stages: list,
  batch_sharding,
  start: int,
) -> Prefetcher:
  """(step, batch) for the steps after `start`, made prefetch_depth(config)
  steps ahead on a worker thread (Prefetcher) and transferred there,
  one transfer per batch; depth 0: made in the loop's thread, host arrays
  that the step's dispatch places (one process; several: placed here).
  The step's key is drawn inside the step (lra.train.steps.step_key:
  fold_in(fold_in(key(seed), 1), s))."""
  depth = prefetch_depth(config)
  on_host = depth == 0 and jax.process_count() == 1

  make = batching.training_batches(config, task, data, stages)

  def prepared(step):
    batch = make(step - 1)
    return batch if on_host else runtime.to_device(batch, batch_sharding)

  steps_left = range(start + 1, config.num_train_steps + 1)
  return Prefetcher(prepared, steps_left, depth)


def prefetch_depth(config: ConfigDict) -> int:
  """config.prefetch, with -1 (the default): 0 on a CPU, 2 on an
  accelerator. On a CPU the loop's own thread is faster (measured in
  docs/benchmark.md: a worker thread contends with the step's dispatch for
  Python's lock); on a GPU/TPU the worker keeps the next two batches
  transferred while the device computes."""
  depth = config.get('prefetch', -1)
  if depth < 0:
    return 0 if jax.default_backend() == 'cpu' else 2
  return depth
