"""Transformer-XL's core in the shared suite: called without memory (one
segment) with relative positions; zero W_R and u leave plain softmax. Its
memory is tests/test_recurrent.py."""

from models.attention.relative import zero_positions

# The shared suite's settings for this core (tests/test_attention_suite.py).
SUITE = dict(
  opts={'relative': True},
  exact={'relative': True},
  hook=zero_positions,
  # Rotary (tests/test_positions.py): without memory and without its
  # relative positions it is softmax attention.
  rotary_opts={},
)
