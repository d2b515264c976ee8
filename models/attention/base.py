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
import numpy as np

from errors import UserError


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
  # How rotary positions apply (models/positions.py), checked once by
  # MultiHeadAttention at construction: 'scores' (every logit is q_i . k_j
  # of rotated vectors), 'features' (q, k rotated before a feature map whose
  # kernel depends on q . k and the norms only), or None (refused, with
  # rotary_refusal saying why). Every core declares it in its own class
  # (tests/test_positions.py); an instance may narrow it from its options.
  rotary = None
  rotary_refusal = 'it declares no rotary capability'

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


def attend(
  q_XxCxD, k_XxKxD, v_XxKxD, allowed_XxCxK, *, scale, rate=0.0, key=None
):
  """Masked softmax attention over gathered keys; any leading dims X.

  The shared kernel of the sparse cores: each gathers, per query block, the
  K keys it may see (K << L) and calls this. Logits and softmax in float32;
  `allowed` (broadcastable to [..., C, K]) says which (query, key) pairs are
  visible; a query with no visible key gets zeros (never NaN, finite
  gradients). Returns out [..., C, D] in v's dtype.
  """
  logits_XxCxK = (
    jnp.einsum(
      '...cd,...kd->...ck',
      q_XxCxD,
      k_XxKxD,
      preferred_element_type=jnp.float32,
    )
    * scale
  )
  weights_XxCxK = masked_softmax(logits_XxCxK, allowed_XxCxK, rate, key)
  return jnp.einsum(
    '...ck,...kd->...cd', weights_XxCxK.astype(v_XxKxD.dtype), v_XxKxD
  )


def masked_softmax(logits, allowed, rate=0.0, key=None):
  """softmax over the last axis of float32 logits where `allowed`, then
  dropout; a row with nothing allowed gets zero weights (not a uniform
  average, never NaN). The one masked softmax of the efficient cores."""
  logits = jnp.where(allowed, logits, -1e30)
  weights = jnp.where(allowed, jax.nn.softmax(logits, axis=-1), 0.0)
  return dropout(weights, rate, key)


def pad_to_multiple(x, multiple, axis=1, value=0):
  """Pads `axis` of x at the end up to a multiple of `multiple`."""
  extra = -x.shape[axis] % multiple
  if not extra:
    return x
  widths = [(0, 0)] * x.ndim
  widths[axis] = (0, extra)
  return jnp.pad(x, widths, constant_values=value)


def key_valid_BxM(mask, batch, length_k):
  """bool[B, M]: the key padding mask, all True when there is none."""
  if mask.key_padding_BxM is None:
    return jnp.ones((batch, length_k), bool)
  return mask.key_padding_BxM


def int_option(core, name, value, minimum, example):
  """value if it is an integer >= minimum, else one sentence naming the
  option of `core` (a registry name) and a valid setting."""
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
    problem = 'an integer'
  elif value < minimum:
    problem = f'an integer >= {minimum}'
  else:
    return int(value)
  raise UserError(
    f'{core} {name} must be {problem}, got {value!r}; set e.g. '
    f'--config.model.attention.{name}={example}.'
  )


def bool_option(core, name, value):
  """value if it is a bool, else one sentence naming the option."""
  if isinstance(value, bool):
    return value
  raise UserError(
    f'{core} {name} must be true or false, got {value!r}; set '
    f'--config.model.attention.{name}=True or False.'
  )


def refuse_causal(core, mask, why=''):
  """Raises the one-sentence error for a core that cannot be causal."""
  if mask.causal:
    raise UserError(
      f'Attention core {core.registry_name!r} cannot be causal'
      f'{why}; use another core for causal masks.'
    )
