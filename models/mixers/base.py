"""The sequence-mixer contract: a mixer replaces a block's attention sub-layer.

  mixer(x_BxLxE, mask, *, rngs=None) -> (y_BxLxE, aux)

x is the block's normalised input (not q/k/v); `mask` is the same structured
`Mask` the attention cores receive (key padding bool[B, L] + a causal flag).
`rngs` is a PRNG key for the mixer's own dropout (None: deterministic); `aux`
is a dict (empty for the mixers here).

Rules, as for attention cores: a padded position changes no real output (the
builder zeroes the input at padded positions before the call, and each mixer
says what more it needs: a scan must also keep the padded steps from
touching its state, an FFT convolution must not wrap around); an all-padded
example gives zeros; causal=True means y_t depends on x_<=t only; sums,
scans and FFTs in float32 whatever the compute dtype; no parameter is drawn
from anything but the builder's `rngs`.

Mixers live in models/mixers/<name>.py, one per file, registered in the one
registry (models/attention/registry.py) with `@register('<name>')`, and are
configured through `model.attention` like every core
(`--config.model.attention.name=s5 --config.model.attention.state_size=32`).
"""

import math

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from models.attention import base as attention_base
from models.attention.base import bool_option
from models.errors import UserError


class SequenceMixer(nnx.Module):
  """Base class. Subclasses set the flags and implement __call__.

  Constructors take keyword arguments: the common ones (passed by the
  builder: emb_dim, num_heads, max_length, dropout_rate, dtype, rngs,
  layer_index) plus the mixer's own options from `config.model.attention`.
  """

  # Tells the builder to pass the block's input instead of q/k/v.
  is_mixer = True
  # Can run with causal=True.
  supports_causal = True
  # Flags the attention cores carry; the builder reads them on both kinds.
  shared_qk = False
  needs_max_len = False
  recurrent = False
  has_aux_loss = False
  # Positions inside attention (pia, rotary, relative) do not apply: a
  # mixer orders tokens by itself. Absolute positions at the embedding do.
  rotary = None
  rotary_refusal = 'it is a sequence mixer, which orders tokens itself'
  # Names of this module's parameters that form its state-space part
  # (A, B, dt as their authors group them): with config.ssm_learning_rate
  # > 0 they train at that rate and config.ssm_weight_decay
  # (lra/train/steps.py make_optimizer); a submodule holding such
  # parameters declares its own.
  ssm_params = ()

  def state_size(self):
    """Numbers of recurrent state per example (Zoology's x-axis), or None."""
    return None

  def __call__(self, x_BxLxE, mask, *, rngs=None):
    raise NotImplementedError


def zero_padded(x_BxLxE, mask):
  """x with padded positions set to zero (the builder's padding rule)."""
  if mask.key_padding_BxM is None:
    return x_BxLxE
  return jnp.where(mask.key_padding_BxM[:, :, None], x_BxLxE, 0)


def real_BxL(mask, batch, length):
  """bool[B, L]: True at real tokens (all True without padding)."""
  if mask.key_padding_BxM is None:
    return jnp.ones((batch, length), bool)
  return mask.key_padding_BxM


def reverse_real(x_BxLxE, mask):
  """x with each example's real tokens in reverse order, padding kept where
  it was (a left-packed example [a b c _ _] -> [c b a _ _]): the input of a
  mixer's backward pass, whose output is reversed back by the same call.
  Without padding this is a flip along L."""
  b, length = x_BxLxE.shape[:2]
  if mask.key_padding_BxM is None:
    return x_BxLxE[:, ::-1]
  n_B = jnp.sum(mask.key_padding_BxM, axis=-1)
  t_L = jnp.arange(length)
  idx_BxL = jnp.where(
    t_L[None, :] < n_B[:, None], n_B[:, None] - 1 - t_L[None, :], t_L[None, :]
  )
  return jnp.take_along_axis(x_BxLxE, idx_BxL[:, :, None], axis=1)


def dropout(x, rate, key):
  """Inverted dropout: the attention cores' one (models/attention/base.py,
  its keep-mask rule per backend); identity when key is None or rate is 0."""
  return attention_base.dropout(x, rate, key)


# Option checks and parameter helpers the mixers share.


def ssm_output(mixer, y_BxLxE, x_BxLxE, mask, rngs):
  """The S4/S5 layer's head after its SSM (s4d, s5): GELU (the tanh form
  when mixer.gelu_approximate, as the S5 authors' flax nn.gelu; else the
  exact erf form, as S4D's PyTorch nn.GELU), dropout, then
  mixer.out (a Linear, or None for none) and, with activation 'glu', the
  GLU of its two halves; padded positions zeroed, in x's dtype."""
  b, length, _ = x_BxLxE.shape
  h = nnx.gelu(y_BxLxE, approximate=mixer.gelu_approximate)
  h = dropout(h, mixer.dropout_rate, rngs)
  if mixer.out is not None:
    h = mixer.out(h.astype(mixer.dtype))  # [B, L, E] or [B, L, 2E]
  if mixer.activation == 'glu':
    a_BxLxE, gate_BxLxE = jnp.split(h, 2, axis=-1)
    h = a_BxLxE * jax.nn.sigmoid(gate_BxLxE)
  out_BxLxE = jnp.where(real_BxL(mask, b, length)[:, :, None], h, 0)
  return out_BxLxE.astype(x_BxLxE.dtype), {}


def choice_option(core, name, value, choices):
  """value if it is one of `choices`, else one sentence naming them."""
  if isinstance(value, str) and value in choices:
    return value
  raise UserError(
    f'{core} {name} must be one of {", ".join(choices)}, got {value!r}; set '
    f'e.g. --config.model.attention.{name}={choices[0]}.'
  )


def step_range_option(core, dt_min, dt_max):
  """(dt_min, dt_max) as floats if 0 < dt_min <= dt_max, else one sentence."""
  ok = all(
    isinstance(v, (int, float, np.floating)) and not isinstance(v, bool)
    for v in (dt_min, dt_max)
  )
  if ok and 0 < dt_min <= dt_max and math.isfinite(dt_max):
    return float(dt_min), float(dt_max)
  raise UserError(
    f'{core} needs 0 < dt_min <= dt_max, got dt_min={dt_min!r} and '
    f'dt_max={dt_max!r}; set e.g. --config.model.attention.dt_min=0.001 '
    '--config.model.attention.dt_max=0.1.'
  )


def ssm_head_options(core, dt_min, dt_max, bidirectional, activation):
  """The options s4d and s5 share, checked: (dt_min, dt_max, bidirectional,
  activation) with activation 'gelu' or 'glu'."""
  dt_min, dt_max = step_range_option(core, dt_min, dt_max)
  bidirectional = bool_option(core, 'bidirectional', bidirectional)
  activation = choice_option(core, 'activation', activation, ('gelu', 'glu'))
  return dt_min, dt_max, bidirectional, activation


def numpy_rng(rngs):
  """A numpy Generator seeded by one key of the builder's rngs: every random
  parameter still comes from `rngs`, without the one compilation per
  parameter shape that eager jax.random calls cost (a second per layer on
  a CPU)."""
  seed = jax.random.bits(rngs.params(), (4,), jnp.uint32)
  return np.random.default_rng(np.asarray(seed))


def f32_param(value):
  """An nnx.Param holding `value` (numpy or jax) as float32."""
  return nnx.Param(jnp.asarray(value, jnp.float32))


def causal_conv(x_BxLxF, w_KxF, bias_F):
  """Depthwise causal conv: y_t = bias + sum_j w_j x_(t - K + 1 + j), the
  inputs before the start taken as zero (PyTorch's Conv1d, padding K - 1,
  truncated to L). float32."""
  k, length = w_KxF.shape[0], x_BxLxF.shape[1]
  x_BxLxF = jnp.pad(x_BxLxF.astype(jnp.float32), ((0, 0), (k - 1, 0), (0, 0)))
  y_BxLxF = jnp.zeros_like(x_BxLxF[:, :length]) + bias_F.astype(jnp.float32)
  for j in range(k):
    y_BxLxF = (
      y_BxLxF + w_KxF[j].astype(jnp.float32) * x_BxLxF[:, j : j + length]
    )
  return y_BxLxF


def inverse_softplus(y):
  """x with softplus(x) = y (y > 0): y + log(1 - exp(-y)); the dt bias
  initialisation of mamba, mamba2 and gated deltanet."""
  return y + jnp.log(-jnp.expm1(-y))
