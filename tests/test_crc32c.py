"""lra/data/tfrecord.py's CRC-32C: the installed native package (crc32c or
google_crc32c), else the pure-Python table; all give the same checksums."""

import importlib
import sys

import numpy as np
import pytest

from lra.data import tfrecord

CHECK = 0xE3069283  # CRC-32C of b'123456789', the standard check value


def _natives():
  """{name: function} of the native packages installed here."""
  out = {}
  try:
    import crc32c  # pylint: disable=g-import-not-at-top

    out['crc32c'] = lambda data: crc32c.crc32c(bytes(data))
  except ImportError:
    pass
  try:
    import google_crc32c  # pylint: disable=g-import-not-at-top

    out['google_crc32c'] = lambda data: google_crc32c.value(bytes(data))
  except ImportError:
    pass
  return out


def test_the_chosen_crc_gives_the_check_value():
  assert tfrecord.crc32c(b'123456789') == CHECK
  assert tfrecord._crc32c_python(b'123456789') == CHECK
  natives = _natives()
  # The native package is used when one is installed (requirements.txt
  # installs crc32c).
  want = next(iter(natives), 'python')
  assert tfrecord.CRC32C_SOURCE == want
  for name, fn in natives.items():
    assert fn(b'123456789') == CHECK, name


def test_every_implementation_agrees_on_random_bytes():
  natives = _natives()
  if not natives:
    pytest.skip('no native CRC-32C package installed')
  rng = np.random.default_rng(0)
  for size in (0, 1, 7, 64, 1000, 4099):
    data = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
    want = tfrecord._crc32c_python(data)
    assert tfrecord.crc32c(data) == want, size
    assert tfrecord.crc32c(memoryview(data)) == want, size
    for name, fn in natives.items():
      assert fn(data) == want, (name, size)


def test_without_a_native_package_the_python_table_is_used(monkeypatch):
  monkeypatch.setitem(sys.modules, 'crc32c', None)  # import fails
  monkeypatch.setitem(sys.modules, 'google_crc32c', None)
  assert tfrecord._native_crc32c() is None
  try:
    fallback = importlib.reload(tfrecord)
    assert fallback.CRC32C_SOURCE == 'python'
    assert fallback.crc32c is fallback._crc32c_python
    assert fallback.masked_crc(b'abc') == fallback.masked_crc(bytearray(b'abc'))
  finally:
    monkeypatch.undo()
    importlib.reload(tfrecord)
  assert tfrecord.CRC32C_SOURCE == next(iter(_natives()), 'python')
