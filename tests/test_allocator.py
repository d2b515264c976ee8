"""lra/allocator.py: a training step's minor page faults stay low, and
LRA_MALLOC=system turns the setting off (counted by resource.getrusage in
a child process, never timed)."""

import os

import pytest

from lra import allocator
from experiments.cpu_cost import cpu_cost

# The smoke model at a batch and length whose step's temporary buffers
# (XLA's temp, about 150 MB) are far above glibc's mmap threshold, on one
# device: with glibc's defaults every step maps and unmaps them.
CONFIG = [
  '--config=configs/listops.py:transformer,smoke',
  '--config.batch_size=16',
  '--config.max_length=512',
]
# One device, so the buffers are not split between fake devices.
ONE_DEVICE = {'XLA_FLAGS': ''}
# Page faults a step may take beyond the growth of the resident set (a
# kept heap faults only on pages it keeps; how many of the first steps grow
# it depends on the order of XLA's frees, which the machine's load moves);
# with glibc's defaults each step faults on every page of its temp again
# (about 36,000).
BOUND = 2_000


@pytest.fixture(scope='module')
def rows():
  return {
    setting: cpu_cost.measure_in_child(
      CONFIG, setting, steps=7, warmup=2, env=ONE_DEVICE
    )
    for setting in ('keep', 'system')
  }


def test_faults_per_step_under_bound(rows):
  row = rows['keep']
  assert 'error' not in row, row
  assert row['allocator'] == 'keep'
  assert row['refaults_per_step'] < BOUND, row
  # Over the timed steps, growth included, fewer than glibc's defaults.
  assert row['minflt_per_step'] < rows['system']['minflt_per_step'], row


def test_opt_out_turns_it_off(rows):
  row = rows['system']
  assert 'error' not in row, row
  assert row['allocator'] == 'system'
  # glibc's defaults fault on every page of the step's buffers.
  assert row['refaults_per_step'] > 10 * BOUND, row
  assert row['minflt_median_per_step'] > 10 * BOUND, row


def test_this_process_has_it():
  """The test suite's own process: lra was imported, so it is configured
  (unless the suite itself was started with an opt-out or a preload)."""
  expected = 'system' if os.environ.get('LRA_MALLOC') == 'system' else 'keep'
  if allocator.preloaded():
    expected = 'preloaded'
  assert allocator.configure() == expected


def test_preloaded_allocator_is_left_alone(monkeypatch):
  monkeypatch.setenv(
    'LD_PRELOAD', '/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4'
  )
  assert allocator.preloaded() == 'tcmalloc'
  monkeypatch.setenv('LD_PRELOAD', '/usr/lib/libfoo.so')
  assert allocator.preloaded() is None
