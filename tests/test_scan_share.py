"""python -m experiments.mamba_recall.scan_share: both programs compile, differ, and the
mixer's own scan is back in place afterwards."""

import jax
import numpy as np

from experiments.mamba_recall import scan_share
import models.mixers.mamba as mamba_module


def test_with_and_without_the_scan_and_the_scan_restored():
  real = mamba_module.scan_for
  fs, inputs = scan_share.programs(2, 16, 8, True, ('xla', 'auto'))
  assert mamba_module.scan_for is real
  with_scan = jax.tree.leaves(fs['xla'](*inputs))
  native = jax.tree.leaves(fs['auto'](*inputs))  # C++ where it builds
  for a, b in zip(with_scan, native):  # the two kernels: the same gradients
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5 * np.abs(a).max())
  without = jax.tree.leaves(fs['without'](*inputs))
  assert len(with_scan) == len(without)
  assert any(not np.allclose(a, b) for a, b in zip(with_scan, without))
