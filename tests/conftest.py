"""Test setup: CPU only, 4 fake devices so sharding is exercised everywhere."""

import os
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


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMOKE = 'configs/listops.py:transformer,smoke'


@pytest.fixture(scope='session')
def smoke_data_dir(tmp_path_factory):
  """A data root with the ListOps smoke cache (shared; never modify it)."""
  from lra import tasks  # pylint: disable=g-import-not-at-top

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
