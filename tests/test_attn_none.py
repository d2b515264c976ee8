"""The ceiling core (models/attention/none.py): no token mixing at all."""

from attention_oracle import make, padding, qkv, run
import numpy as np

# The shared suite's settings for this core (tests/test_attention_suite.py).
SUITE = dict(opts={}, exact=None, identity='out = v, this file')


def test_none_is_the_identity():
  """The ceiling core mixes nothing: out = v where a query sees any key."""
  q, k, v = qkv(0, 2, 37, 2, 8)
  core = make({'name': 'none'}, num_heads=2, head_dim=8, max_length=64)
  out = run(core, q, k, v, padding((37, 20), 37))
  np.testing.assert_array_equal(out, np.asarray(v))
