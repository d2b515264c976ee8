"""Test setup: CPU only, 4 fake devices so sharding is exercised everywhere."""

import os
import sys
import tempfile

os.environ['JAX_PLATFORMS'] = 'cpu'
os.environ['XLA_FLAGS'] = (
  os.environ.get('XLA_FLAGS', '') + ' --xla_force_host_platform_device_count=4'
)
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Tests never read or write the user's data directory.
os.environ['LRA_DATA_DIR'] = tempfile.mkdtemp(prefix='lra_test_data_')
