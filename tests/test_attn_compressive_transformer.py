"""The Compressive Transformer's core in the shared suite: as
Transformer-XL's (tests/test_attn_transformer_xl.py), one segment, no
memory. Its memories and compression are tests/test_recurrent.py."""

from models.attention.relative import zero_positions

# The shared suite's settings for this core (tests/test_attention_suite.py).
SUITE = dict(
  opts={'relative': True},
  exact={'relative': True},
  hook=zero_positions,
  rotary_opts={},
)
