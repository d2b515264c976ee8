"""The attention contract every core implements.

  core(q_BxLxHxD, k_BxMxHxD, v_BxMxHxD, mask, *, rngs=None, memory=None)
      -> (out_BxLxHxD, aux)

q, k, v are already projected and split into heads. `mask` is structured
(key padding + a causal flag), never a dense L x L array, so efficient cores
can stay sub-quadratic. `rngs` is a PRNG key for attention dropout (None:
deterministic). `aux` is a dict (auxiliary losses, recurrent memory, ...).

Rules: padding is honoured (changing padded keys changes no real output; a
query with no visible key gets zeros, never NaN); softmax, normalisers and
prefix sums in float32 whatever the compute dtype; random patterns and
features from explicit keys.
"""

from typing import NamedTuple

from flax import nnx
import jax
import jax.numpy as jnp


class Mask(NamedTuple):
  """Which keys a query may see."""

  key_padding_BxM: jax.Array | None = None  # True = real token
  causal: bool = False


class AttentionCore(nnx.Module):
  """Base class. Subclasses set the capability flags and implement __call__.

  Constructors take keyword arguments: the common ones below (passed by the
  builder) plus the core's own options from `config.model.attention`.
  """

  # Can run with causal=True (decoder / language modelling use).
  supports_causal = True
  # Queries and keys must be the same projection (Reformer's LSH).
  shared_qk = False
  # Needs the maximum sequence length at construction (Linformer, Synthesizer).
  needs_max_len = False
  # Carries memory across segments (Transformer-XL, Compressive).
  recurrent = False
  # Returns an auxiliary loss in aux['loss'].
  has_aux_loss = False

  def __call__(
    self, q_BxLxHxD, k_BxMxHxD, v_BxMxHxD, mask, *, rngs=None, memory=None
  ):
    raise NotImplementedError


def dropout(x, rate, key):
  """Inverted dropout; identity when key is None or rate is 0."""
  if key is None or rate == 0.0:
    return x
  keep = jax.random.bernoulli(key, 1.0 - rate, x.shape)
  return jnp.where(keep, x / (1.0 - rate), jnp.zeros_like(x))


def visible_any_BxL(mask, batch, length_q, length_k):
  """bool[B, L]: whether a query has at least one visible key."""
  if mask.key_padding_BxM is None:
    return jnp.ones((batch, length_q), bool)
  any_b = jnp.any(mask.key_padding_BxM, axis=-1, keepdims=True)
  if mask.causal:
    # Query i sees keys <= i; with padding, it sees some key iff a real key
    # exists at or before i.
    first_real = jnp.argmax(mask.key_padding_BxM, axis=-1)[:, None]
    return any_b & (jnp.arange(length_q)[None, :] >= first_real)
  return jnp.broadcast_to(any_b, (batch, length_q))
