"""The shared pieces below the command lines: the name-list grammar
(lra/train/names.py, read by lra-sweep and lra-benchmark) and the one
out-of-memory detector (lra/train/oom.py, asked by the training loop and
both benchmarks)."""

import pytest

from lra.errors import UserError
from lra.train.names import select_names
from lra.train.oom import OutOfMemory, memory_limit, out_of_memory

KNOWN = ('a', 'b', 'c', 'd')


def test_names_in_the_order_given_with_all_and_drops():
  assert select_names('c,a', KNOWN, '--x') == ['c', 'a']
  assert select_names('all', KNOWN, '--x') == list(KNOWN)
  assert select_names('all,-b', KNOWN, '--x') == ['a', 'c', 'd']
  # 'all' where it stands; a name kept once, at its first place.
  assert select_names('d,all', KNOWN, '--x') == ['d', 'a', 'b', 'c']
  assert select_names(' b , b,,-c', KNOWN, '--x') == ['b']
  # Names put first are dropped by '-name' too.
  assert select_names('c', KNOWN, '--x', first=('a', 'b')) == ['a', 'b', 'c']
  assert select_names('c,-a', KNOWN, '--x', first=('a', 'b')) == ['b', 'c']


def test_names_errors_are_one_sentence_naming_the_flag():
  with pytest.raises(UserError) as e:
    select_names('a,-zz', KNOWN, '--models', noun='model')
  assert str(e.value) == (
    "Unknown model 'zz' in --models; valid: all, a, b, c, d."
  )
  with pytest.raises(UserError) as e:
    select_names('a,-a', KNOWN, '--tasks', noun='task')
  assert str(e.value) == (
    "--tasks 'a,-a' leaves no task to run; name at least one, e.g. --tasks a."
  )


def test_out_of_memory_detector():
  assert out_of_memory(RuntimeError('RESOURCE_EXHAUSTED: 9.0GiB'))
  assert out_of_memory(RuntimeError('Out of memory while allocating'))
  assert out_of_memory(MemoryError())
  assert out_of_memory(OutOfMemory('needs 9 GB'))
  assert not out_of_memory(ValueError('bad shape'))
  limit = memory_limit()
  assert limit is None or limit > 0
