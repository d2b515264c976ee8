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

import functools
from typing import NamedTuple

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from models.errors import UserError


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


DROPOUT_LEVELS = 256  # the accelerator rule's rate resolution: 1/256


def dropout_bits_for(backend=None):
  """The keep mask's source: 'bernoulli' on CPU, else 'uint8' (`dropout`)."""
  backend = backend or jax.default_backend()
  return 'bernoulli' if backend == 'cpu' else 'uint8'


def uint8_dropout_threshold(rate):
  """t = round(rate * 256): a byte < t is dropped (rate quantised to t/256);
  None where the uint8 rule does not apply (t of 0 or 256, traced rate)."""
  if not isinstance(rate, (int, float)):
    return None
  t = round(rate * DROPOUT_LEVELS)
  return t if 0 < t < DROPOUT_LEVELS else None


def uint8_bits(key, shape):
  """uint8[shape] of uniform random bytes, four from each 32-bit word of
  jax.random.bits (one threefry hash per 4 bytes, not one per byte as
  jax.random.bits(key, shape, jnp.uint8) spends); leading dims are kept,
  so a batch-sharded shape stays sharded."""
  lead, last = tuple(shape[:-1]), (shape[-1] if shape else 1)
  words = jax.random.bits(key, lead + (-(-last // 4),), jnp.uint32)
  bytes_ = jax.lax.bitcast_convert_type(words, jnp.uint8)
  return bytes_.reshape(lead + (-1,))[..., :last].reshape(shape)


def dropout(x, rate, key, *, backend=None):
  """Inverted dropout; identity when key is None or rate is 0.

  The keep mask follows one config-free rule (`dropout_bits_for`; backend
  defaults to jax.default_backend()):
    'cpu': jax.random.bernoulli(key, 1 - rate) over x, kept values scaled
      by 1/(1 - rate): 32 random bits per element, the rate exact; every
      CPU result is what it always was.
    any other backend (GPU, TPU): one random byte per element
      (`uint8_bits`: four bytes per 32-bit word of the key's own generator,
      a quarter of the hashing), kept where byte >= t = round(rate * 256).
      The rate is quantised to 1/256: the effective rate is t/256, within
      1/512 of rate (0.1 -> 26/256 = 0.1016), and kept values are scaled
      by 1/(1 - t/256), so the expectation E[out] = x is exact. Where t
      would be 0 or 256 (rate < 1/512 or > 1 - 1/512) or rate is traced,
      the CPU rule applies.
  Both are functions of the key alone: one seed gives the same run on one
  backend (and remat recomputes the same mask); for one key the two rules
  draw different masks. Not XLA's RngBitGenerator ('rbg' keys): under the
  data-parallel mesh it is not partitioned (each device would draw the
  whole batch's bits), under vmap it reads only the first key, and JAX
  documents its bits as unstable across XLA versions.

  The backward pass keeps the keep mask packed 8 flags to a byte (a custom
  VJP, `_dropout`), where plain autodiff left XLA to keep the random words
  it compares (on CPU both 32-bit threefry outputs: 8 bytes per element,
  64 times more). Values and gradients are bit for bit those of
  jnp.where(keep, x / (1 - rate), 0) under JAX's own autodiff.
  """
  if key is None or rate == 0.0:
    return x
  t = uint8_dropout_threshold(rate)
  if dropout_bits_for(backend) == 'bernoulli':
    t = None
  if not isinstance(rate, (int, float)):  # traced: no static rate to close on
    return _dropped(x, _keep_mask(key, x.shape, rate, t), rate, t)
  return _dropout(x, key, float(rate), t)


def _keep_mask(key, shape, rate, t):
  """`dropout`'s keep mask: bernoulli(1 - rate) where t is None, else the
  uint8 rule (byte >= t)."""
  if t is None:
    return jax.random.bernoulli(key, 1.0 - rate, shape)
  return uint8_bits(key, shape) >= t


def _dropped(x, keep, rate, t):
  """Kept values scaled by 1 / (1 - rate) (uint8 rule: 1 - t / 256)."""
  scale = 1.0 - rate if t is None else 1.0 - t / DROPOUT_LEVELS
  return jnp.where(keep, x / scale, jnp.zeros_like(x))


def _pack(keep):
  """bool[..., K] -> uint8[..., ceil(K / 8)], flag k in bit k % 8."""
  keep = keep.reshape(keep.shape or (1,))
  keep = pad_to_multiple(keep, 8, axis=keep.ndim - 1, value=False)
  keep = keep.reshape(keep.shape[:-1] + (-1, 8)).astype(jnp.uint8)
  shifts = jnp.arange(8, dtype=jnp.uint8)
  return jnp.sum(keep << shifts, axis=-1, dtype=jnp.uint8)


def _unpack(packed, shape):
  """The bool[shape] that `_pack` packed."""
  bits = (packed[..., None] >> jnp.arange(8, dtype=jnp.uint8)) & 1
  bits = bits.reshape(packed.shape[:-1] + (-1,))
  return bits[..., : (shape[-1] if shape else 1)].reshape(shape).astype(bool)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _dropout(x, key, rate, t):
  return _dropped(x, _keep_mask(key, x.shape, rate, t), rate, t)


def _dropout_fwd(x, key, rate, t):
  keep = _keep_mask(key, x.shape, rate, t)
  return _dropped(x, keep, rate, t), _pack(keep)


def _dropout_bwd(rate, t, packed, g):
  # JAX's transpose of where(keep, x / scale, 0): where(keep, g, 0) / scale.
  keep = _unpack(packed, g.shape)
  scale = 1.0 - rate if t is None else 1.0 - t / DROPOUT_LEVELS
  return jnp.where(keep, g, jnp.zeros_like(g)) / scale, None


_dropout.defvjp(_dropout_fwd, _dropout_bwd)


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


class _Static:
  """fn and the args' tree structure: the static part of `recomputed`."""

  def __init__(self, fn, tree):
    self.fn, self.tree = fn, tree


def _opaque_zero(x):
  """int32 0 computed from one element of x, which XLA cannot fold: the
  leading-zero count of a 32-bit word is at most 32, so >> 6 gives 0."""
  word = x.reshape(-1)[0].astype(jnp.float32)
  return jax.lax.clz(jax.lax.bitcast_convert_type(word, jnp.int32)) >> 6


def _tie(x, zero):
  """x, bit for bit, as a value XLA sees depending on `zero`."""
  if x is None:
    return x
  if jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
    data = jax.random.key_data(x)
    return jax.random.wrap_key_data(
      data | zero.astype(data.dtype), impl=jax.random.key_impl(x)
    )
  if x.dtype == jnp.bool_:
    return x | (zero != 0)
  if jnp.issubdtype(x.dtype, jnp.integer):
    return x | zero.astype(x.dtype)
  uint = {2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint64}[x.dtype.itemsize]
  bits = jax.lax.bitcast_convert_type(x, uint) | zero.astype(uint)
  return jax.lax.bitcast_convert_type(bits, x.dtype)


def _differentiable(x):
  return x is not None and jnp.issubdtype(x.dtype, jnp.inexact)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _recomputed(static, *leaves):
  return static.fn(*jax.tree.unflatten(static.tree, leaves))


def _recomputed_fwd(static, *leaves):
  return _recomputed(static, *leaves), leaves


def _recomputed_bwd(static, leaves, g):
  zero = _opaque_zero(next(x for x in jax.tree.leaves(g) if _differentiable(x)))
  tied = [_tie(x, zero) for x in leaves]
  diff = [i for i, x in enumerate(tied) if _differentiable(x)]

  def f(*d):
    full = list(tied)
    for i, x in zip(diff, d, strict=True):
      full[i] = x
    return static.fn(*jax.tree.unflatten(static.tree, full))

  _, vjp = jax.vjp(f, *[tied[i] for i in diff])
  cts = dict(zip(diff, vjp(g), strict=True))
  return tuple(cts.get(i) for i in range(len(leaves)))


_recomputed.defvjp(_recomputed_fwd, _recomputed_bwd)


def recomputed(fn, *args):
  """fn(*args), its backward pass recomputing fn's forward from args.

  Residuals are args only (for a sparse core: q, k, v, the key padding
  mask and the dropout key), not fn's intermediates (gathered key/value
  copies, logits, weights, dropout masks). Values and gradients are those
  of fn itself. The recomputation is tied to the output cotangent by a
  data dependency XLA cannot fold (`_opaque_zero`), so XLA cannot merge it
  with the forward pass by common-subexpression elimination: jax.checkpoint
  relies on an optimization barrier, which XLA's CPU compiler removes, so
  there it saves nothing. fn must close over no traced values (only
  Python and numpy constants); args may hold arrays, PRNG keys and None.
  """
  leaves, tree = jax.tree.flatten(args, is_leaf=lambda x: x is None)
  return _recomputed(_Static(fn, tree), *leaves)
