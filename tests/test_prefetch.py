"""lra/train/prefetch.py: batches in step order at every depth, errors at the
step that needed them, the worker stopped by close; train.py's depth."""

import threading

import pytest

from configs import listops as listops_config
from lra.train import prefetch
from lra.train.prefetch import Prefetcher


@pytest.mark.parametrize('depth', [0, 1, 2, 5])
def test_every_depth_yields_the_steps_in_order(depth):
  made = []

  def make(step):
    made.append((step, threading.current_thread().name))
    return {'step': step}

  with Prefetcher(make, range(3, 9), depth) as batches:
    got = list(batches)
  assert got == [(s, {'step': s}) for s in range(3, 9)]
  workers = {name for _, name in made}
  # Depth 0 makes each batch in the caller's thread, others on the worker.
  assert workers == ({'MainThread'} if depth == 0 else {'lra-prefetch'})


@pytest.mark.parametrize('depth', [0, 2])
def test_an_error_is_raised_at_the_step_that_needed_the_batch(depth):
  def make(step):
    if step == 4:
      raise ValueError('damaged cache')
    return step

  got = []
  with pytest.raises(ValueError, match='damaged cache'):
    with Prefetcher(make, range(1, 10), depth) as batches:
      for step, batch in batches:
        got.append(batch)
  assert got == [1, 2, 3]


def test_close_stops_the_worker_when_the_loop_ends_early():
  p = Prefetcher(lambda s: s, range(1, 10**9), 2)
  for step, _ in p:
    if step == 3:
      break
  p.close()
  assert not p._thread.is_alive()  # pylint: disable=protected-access


def test_prefetch_default_is_in_the_loop_on_a_cpu():
  config = listops_config.get_config('transformer,smoke')
  assert config.prefetch == -1
  assert prefetch.prefetch_depth(config) == 0  # the tests run on CPU
  config.prefetch = 3
  assert prefetch.prefetch_depth(config) == 3
