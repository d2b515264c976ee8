"""Test setup: CPU only, 4 fake devices so sharding is exercised everywhere."""

import os
import sys

os.environ['JAX_PLATFORMS'] = 'cpu'
os.environ['XLA_FLAGS'] = (
  os.environ.get('XLA_FLAGS', '') + ' --xla_force_host_platform_device_count=4'
)
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
