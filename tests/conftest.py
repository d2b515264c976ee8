"""Test setup: CPU only, 4 fake devices so sharding is exercised everywhere."""

import os
import shutil
import sys
import tempfile

import pytest

os.environ['JAX_PLATFORMS'] = 'cpu'
os.environ['XLA_FLAGS'] = (
  os.environ.get('XLA_FLAGS', '') + ' --xla_force_host_platform_device_count=4'
)
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Tests never read or write the user's data directory.
os.environ['LRA_DATA_DIR'] = tempfile.mkdtemp(prefix='lra_test_data_')
# One persistent XLA compilation cache for the session's processes (both
# pytest workers and every train.py / benchmark.py subprocess they start):
# the smoke configs' steps compile once, not once per process. Executables
# are keyed by their program and options, so no number changes.
# The process that loads this first (pytest itself, before it starts the
# xdist workers, which inherit its environment) makes the folder and
# removes it at the end (pytest_sessionfinish).
_OWN_CACHE = 'JAX_COMPILATION_CACHE_DIR' not in os.environ
if _OWN_CACHE:
  os.environ['JAX_COMPILATION_CACHE_DIR'] = tempfile.mkdtemp(
    prefix='lra_test_xla_cache_'
  )
  os.environ['JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS'] = '0'
  os.environ['JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES'] = '0'


def pytest_sessionfinish(session, exitstatus):
  del session, exitstatus
  if _OWN_CACHE:
    shutil.rmtree(os.environ['JAX_COMPILATION_CACHE_DIR'], ignore_errors=True)


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMOKE = 'configs/listops.py:transformer,smoke'


@pytest.fixture(scope='session')
def smoke_data_dir(tmp_path_factory):
  """A data root with the ListOps smoke cache (shared; never modify it)."""
  from lra import data as tasks  # pylint: disable=g-import-not-at-top

  path = str(tmp_path_factory.mktemp('data'))
  tasks.get_task('listops').ensure_prepared(path, {'variant': 'smoke'}, False)
  return path


@pytest.fixture(scope='session')
def smoke_run(tmp_path_factory, smoke_data_dir):
  """A finished smoke ListOps run (shared; copy it before damaging it)."""
  import subprocess  # pylint: disable=g-import-not-at-top

  workdir = str(tmp_path_factory.mktemp('full'))
  proc = subprocess.run(
    [
      sys.executable,
      'train.py',
      f'--config={SMOKE}',
      f'--workdir={workdir}',
      f'--config.data_dir={smoke_data_dir}',
    ],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert proc.returncode == 0, proc.stderr
  return workdir


def tree(folder):
  """{relative path: bytes} of every file below `folder` (tests that check
  a refusal touched nothing)."""
  out = {}
  for d, _, files in os.walk(folder):
    for f in files:
      path = os.path.join(d, f)
      with open(path, 'rb') as fh:
        out[os.path.relpath(path, folder)] = fh.read()
  return out
