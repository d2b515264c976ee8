"""Longformer attention: a (dilated) sliding window plus global positions.

Beltagy, Peters and Cohan, "Longformer: The Long-Document Transformer"
(arXiv 2004.05150).

Query i of a head with dilation d, in a layer of window w, sees key j iff
  |i - j| <= (w / 2) * d and (i - j) mod d == 0   (the sliding window: w / 2
  keys on each side plus the query's own position, every d-th position, as
  in the authors' Hugging Face implementation), or
  j in P   (every query sees the global positions P), or
  i in P   (a global query sees every key).
Padding and the causal flag apply on top. In words: a non-global query takes
one softmax over its window and the global keys (a global key inside the
window counts once); a global query takes a softmax over all keys.

The paper's variants, as options (`--config.model.attention.<option>`):
  window          one even size for every layer (default 512), or a comma
                  list with one size per layer ('32,64,128', the tuple
                  (32, 64, 128) in the config: the paper grows the window
                  with depth, section 4.1); a list whose length is not the
                  model's number of layers is an error;
  window_growth   with a single window w, layer l gets
                  2 * round(w * growth**l / 2) (at least 2): 2.0 doubles the
                  window every layer, 1.0 (default) keeps it constant;
  dilation        one value for every head (default 1), or a comma list with
                  one value per head ('1,1,2,2': the paper dilates some heads
                  only, section 3.1);
  global_positions  which positions are global, a task decision in the paper
                  (CLS for classification, question tokens for QA, none for
                  coreference): a comma list ('0,17'), '' or 'none' for no
                  global position, or 'auto' (default): resolved when the
                  model is built (models/encoder.py, `model_options`) to '0'
                  (the CLS, or the pooled first token) with `cls` / `first`
                  pooling and to '' with `mean` / `max` pooling or a causal
                  model; a core built outside a model reads 'auto' as '0'.
                  Positions >= L are ignored at a call of length L;
  global_tokens   the older spelling: an integer g makes the first g
                  positions global ('auto', the default: not set; setting it
                  together with global_positions is an error);
  global_projections  see below.

Layout, with no L x L array anywhere: heads are grouped by their dilation;
in each group the positions are split into their d residue classes mod d (a
dilated window is a contiguous window of half-width w / 2 inside one class);
each class is cut into query blocks of C = ceil(w / 4) positions and every
block gathers the keys of its own and the two neighbouring blocks on each
side (5 C ~ 1.25 w keys, masked to the window's w + 1), plus the g = |P|
global keys (gathered by static index); one joint masked softmax (`attend`)
over those 5 C + g keys. The g global queries attend to all L keys
([B, H, g, L]). When 5 C reaches the class length (about w >= 0.8 L with
d = 1) a class is one block instead, masked to the window, so short inputs
waste no compute. Time O(L (w + g) D), memory O(L (w + g)) per head.
Attention dropout applies to both sets of weights.

global_projections=true: the paper gives the global attention its own
projections Q_g, K_g, V_g. The core receives q, k, v already projected by the
ordinary (sliding-window) projections, so it owns per-head affine maps
A_q, A_k, A_v (D x D weight + D bias each, float32, initialised to identity
and zero: at initialisation the global path equals the ordinary one, as when
the authors' code converts a pretrained model by copying Q_s, K_s, V_s into
Q_g, K_g, V_g). A global query's row uses A_q(q_i) against A_k(k_j) and
A_v(v_j) for all j; every other row uses the ordinary q, k, v, for its window
and for the global keys alike, as in the authors' implementation (and the
reference harness). Since the maps act on the projected heads,
Q_g = A_q o Q_s is confined to affine functions of the ordinary projection (a
free Q_g would need the layer's input, which the core contract does not
carry). With no global position the maps are not created. The maps carry
the metadata `init_from_missing`: a fine-tune from a model without them
(`--config.init_from` a `transformer` run, lra/train/pretrained.py) keeps their
initial identity, which is the paper's conversion (the global projections
start as copies of the trained ordinary ones).
global_projections=false: the global path reuses q, k, v; no parameters.

Exact limit: window >= 2 (L - 1) (e.g. w >= 2 L) in the layer with dilation
1 in every head equals plain softmax attention for any global positions
(with global_projections=false, or true at initialisation); causal without
global positions likewise equals causal softmax attention.

Causal masks are supported only without global positions (a global query
sees every key); with one a causal call raises a UserError.

Differences from the reference harness (google-research/long-range-arena): it
built dense L x L masks and ran full attention (quadratic); its even window had
w / 2 - 1 keys on the left and w / 2 on the right (w keys), here w + 1 as in
the Hugging Face implementation; it had no dilation and one window for every
layer; its encoder never passed a global mask, so its runs had no global
tokens (the global projections were built but unused), here the CLS is
global with CLS pooling. Queries and keys must have the same length
(self-attention).
"""

import numbers

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from models.attention.base import (
  AttentionCore,
  attend,
  bool_option,
  int_option,
  key_valid_BxM,
  pad_to_multiple,
  recomputed,
  refuse_causal,
)
from models.attention.registry import register
from models.errors import UserError

# Query blocks are half-window / SIDE_BLOCKS long and gather SIDE_BLOCKS
# neighbouring blocks on each side: 2 gave the least compiled memory at
# w = 512, L = 4096 (1 wastes more logits, 4 copies keys and values more).
SIDE_BLOCKS = 2
# Parameter metadata read by lra/train/pretrained.py: a fine-tune whose source
# lacks the parameter keeps its initial value (named here).
INIT_FROM_MISSING = 'init_from_missing'


def int_list_option(core, name, value, minimum, example, allow_empty=False):
  """A tuple of integers >= minimum from an int, a list of them or a str
  ('8', '8,16,32' as the command line gives it; '' or 'none' is the empty
  list where allow_empty), else one sentence naming the option."""
  items = None
  if isinstance(value, str):
    text = value.strip()
    parts = [] if text.lower() in ('', 'none') else text.split(',')
    try:
      items = [int(p.strip()) for p in parts]
    except ValueError:
      items = None
  elif isinstance(value, (list, tuple)):
    items = list(value)
  else:
    items = [value]
  if (
    items is not None
    and (items or allow_empty)
    and all(
      isinstance(x, (int, np.integer))
      and not isinstance(x, bool)
      and x >= minimum
      for x in items
    )
  ):
    return tuple(int(x) for x in items)
  raise UserError(
    f'{core} {name} must be an integer >= {minimum} or a comma list of '
    f'them, got {value!r}; set e.g. --config.model.attention.{name}='
    f'{example}.'
  )


def layer_window(windows, growth, layer_index):
  """The window of layer `layer_index` from the parsed `window` option and
  `window_growth` (module docstring), or one sentence."""
  if len(windows) > 1:
    if growth != 1.0:
      raise UserError(
        f'longformer window lists one size per layer ({windows}), so '
        f'window_growth must stay 1.0, got {growth!r}; give either the list '
        'or a single window with a growth factor.'
      )
    if layer_index >= len(windows):
      raise UserError(
        f'longformer window lists {len(windows)} sizes (one per layer) but '
        f'the model has a layer {layer_index}; give one size per layer, '
        'e.g. --config.model.attention.window='
        f'{",".join(str(32 * 2**i) for i in range(layer_index + 1))}.'
      )
    return windows[layer_index]
  return max(2, 2 * round(windows[0] * growth**layer_index / 2))


def global_position_list(global_positions, global_tokens):
  """Sorted unique global positions from the two options, or one sentence."""
  if not (isinstance(global_tokens, str) and global_tokens == 'auto'):
    if not (isinstance(global_positions, str) and global_positions == 'auto'):
      raise UserError(
        'longformer global_tokens and global_positions both name the global '
        f'positions (got {global_tokens!r} and {global_positions!r}); set '
        'only --config.model.attention.global_positions, e.g. 0,17.'
      )
    if isinstance(global_tokens, str) and global_tokens.strip().isdigit():
      global_tokens = int(global_tokens)
    g = int_option('longformer', 'global_tokens', global_tokens, 0, 1)
    return tuple(range(g))
  if isinstance(global_positions, str) and global_positions == 'auto':
    return (0,)  # outside a model: the first token (models/encoder.py)
  positions = int_list_option(
    'longformer', 'global_positions', global_positions, 0, '0,17', True
  )
  return tuple(sorted(set(positions)))


@register('longformer')
class LongformerAttention(AttentionCore):
  supports_causal = True  # only without global positions, checked per call
  # Global rows with global_projections: A_q, A_k act on rotated vectors
  # (relative at initialisation, when they are the identity).
  rotary = 'scores'
  # Options that list one value per layer (registry.check_per_layer: a list
  # must have model.num_layers items).
  per_layer_options = ('window',)

  def __init__(
    self,
    *,
    num_heads,
    head_dim,
    max_length,
    dropout_rate,
    dtype,
    rngs,
    layer_index=0,
    window: int | tuple[int, ...] = 512,
    window_growth: float = 1.0,
    dilation: int | tuple[int, ...] = 1,
    global_positions: int | tuple[int, ...] | str = 'auto',
    global_tokens: int | str = 'auto',
    global_projections: bool = True,
  ):
    del max_length, rngs
    windows = int_list_option('longformer', 'window', window, 2, 512)
    if any(w % 2 for w in windows):
      raise UserError(
        f'Longformer window must be an even integer >= 2 (w / 2 keys on '
        f'each side) or a comma list of them, got {window!r}.'
      )
    if isinstance(window_growth, str):  # from the command line
      try:
        window_growth = float(window_growth)
      except ValueError:
        pass
    if (
      isinstance(window_growth, bool)
      or not isinstance(window_growth, numbers.Real)
      or not window_growth > 0
    ):
      raise UserError(
        f'longformer window_growth must be a number > 0, got '
        f'{window_growth!r}; set e.g. '
        '--config.model.attention.window_growth=2.0.'
      )
    self.window = layer_window(windows, float(window_growth), layer_index)
    dilations = int_list_option('longformer', 'dilation', dilation, 1, 1)
    if len(dilations) == 1:
      dilations = dilations * num_heads
    elif len(dilations) != num_heads:
      half = num_heads // 2
      example = ','.join(['1'] * (num_heads - half) + ['2'] * half)
      raise UserError(
        f'longformer dilation lists {len(dilations)} values but the model '
        f'has {num_heads} heads; give one value per head, e.g. '
        f'--config.model.attention.dilation={example}, or a single value.'
      )
    self.dilations = dilations
    self.dilation = dilations[0] if len(set(dilations)) == 1 else dilations
    self.global_positions = global_position_list(
      global_positions, global_tokens
    )
    bool_option('longformer', 'global_projections', global_projections)
    self.global_projections = global_projections
    self.dropout_rate = dropout_rate
    self.scale = head_dim**-0.5
    self.dtype = dtype
    if global_projections and self.global_positions:
      # A fresh array per parameter: shared buffers cannot be donated. The
      # identity is the paper's conversion of a model without them.
      keep = {INIT_FROM_MISSING: 'identity (a copy of the ordinary one)'}
      eye = lambda: nnx.Param(  # noqa: E731
        jnp.tile(jnp.eye(head_dim, dtype=jnp.float32), (num_heads, 1, 1)),
        **keep,
      )
      zero = lambda: nnx.Param(  # noqa: E731
        jnp.zeros((num_heads, head_dim), jnp.float32), **keep
      )
      self.global_q_HxDxD = eye()
      self.global_k_HxDxD = eye()
      self.global_v_HxDxD = eye()
      self.global_q_bias_HxD = zero()
      self.global_k_bias_HxD = zero()
      self.global_v_bias_HxD = zero()

  @classmethod
  def model_options(cls, options, *, pooling, causal):
    """`options` (a model.attention dict) with global_positions='auto'
    resolved for a model with this pooling: '0' (the pooled CLS or first
    token) with cls / first pooling, '' (none) with mean / max pooling or a
    causal model. Called by models/encoder.py before the blocks are built."""
    auto = lambda name: options.get(name, 'auto') == 'auto'  # noqa: E731
    if not (auto('global_positions') and auto('global_tokens')):
      return options
    pooled_first = pooling in ('cls', 'first') and not causal
    return {**options, 'global_positions': '0' if pooled_first else ''}

  def __call__(
    self, q_BxLxHxD, k_BxMxHxD, v_BxMxHxD, mask, *, rngs=None, memory=None
  ):
    del memory
    b, length, _, _ = q_BxLxHxD.shape
    if k_BxMxHxD.shape[1] != length:
      raise ValueError(
        f'Attention core {self.registry_name!r} needs queries and keys of '
        f'the same length, got {length} and {k_BxMxHxD.shape[1]}.'
      )
    glob_G = np.array(
      [p for p in self.global_positions if p < length], np.int32
    )
    if glob_G.size:
      refuse_causal(
        self,
        mask,
        ' with global positions (set '
        '--config.model.attention.global_positions=none)',
      )
    key_band = key_glob = None
    if rngs is not None:
      key_band, key_glob = jax.random.split(rngs)
    valid_BxL = key_valid_BxM(mask, b, length)
    # Heads grouped by dilation: one banded pass per distinct value.
    groups = sorted(set(self.dilations))
    outs, order = [], []
    for i, d in enumerate(groups):
      heads_h = np.array(
        [h for h, dh in enumerate(self.dilations) if dh == d], np.int32
      )
      pick = (lambda t: t) if len(groups) == 1 else (lambda t: t[:, :, heads_h])  # noqa: E731
      key = key_band
      if key is not None and len(groups) > 1:
        key = jax.random.fold_in(key_band, i)
      band = lambda q, k, v, valid, key, d=d: self._band(  # noqa: E731
        q, k, v, valid, glob_G, mask.causal, key, d
      )
      outs.append(
        recomputed(
          band,
          pick(q_BxLxHxD),
          pick(k_BxMxHxD),
          pick(v_BxMxHxD),
          valid_BxL,
          key,
        )
      )
      order.extend(heads_h.tolist())
    out_BxLxHxD = outs[0]
    if len(groups) > 1:
      out_BxLxHxD = jnp.concatenate(outs, axis=2)[:, :, np.argsort(order)]
    if glob_G.size:
      glob_BxGxHxD = self._global_rows(
        q_BxLxHxD, k_BxMxHxD, v_BxMxHxD, valid_BxL, glob_G, key_glob
      )
      out_BxLxHxD = out_BxLxHxD.at[:, glob_G].set(
        glob_BxGxHxD.astype(out_BxLxHxD.dtype)
      )
    return out_BxLxHxD.astype(self.dtype), {}

  def _band(
    self, q_BxLxHxD, k_BxLxHxD, v_BxLxHxD, valid_BxL, glob_G, causal, key, d
  ):
    """Window (+ global keys) attention of every query of heads with
    dilation d; [B, L, H, D]."""
    b, length, h, dim = q_BxLxHxD.shape
    g = glob_G.size
    n = -(-length // d)  # positions per residue class
    half = min(self.window // 2, max(n - 1, 0))
    side = SIDE_BLOCKS
    size = -(-half // side) if half else 0
    if half == 0 or (2 * side + 1) * size >= n:  # one exact block per class
      size, side = max(n, 1), 0
    blocks = -(-n // size)
    span = (2 * side + 1) * size

    def classes(x_BxLxHxD):
      # [B, L, H, D] -> [B, d, H, n, D]: position p = i * d + r -> (r, i).
      x_BxLxHxD = pad_to_multiple(x_BxLxHxD, d, axis=1)
      x = x_BxLxHxD.reshape(b, n, d, h, dim)
      return x.transpose(0, 2, 3, 1, 4)

    def neighbours(x, axis):
      # Pads the class axis to (blocks + 2 side) * size, `side` blocks
      # before, and gathers each block's 2 side + 1 neighbouring blocks.
      widths = [(0, 0)] * x.ndim
      widths[axis] = (side * size, (blocks + side) * size - n)
      x = jnp.pad(x, widths)
      x = x.reshape(
        x.shape[:axis] + (blocks + 2 * side, size) + x.shape[axis + 1 :]
      )
      parts = [
        jax.lax.slice_in_dim(x, i, i + blocks, axis=axis)
        for i in range(2 * side + 1)
      ]
      return jnp.concatenate(parts, axis=axis + 1)

    q_BxdxHxNxCxD = pad_to_multiple(classes(q_BxLxHxD), size, axis=3).reshape(
      b, d, h, blocks, size, dim
    )
    k_BxdxHxNxKxD = neighbours(classes(k_BxLxHxD), 3)
    v_BxdxHxNxKxD = neighbours(classes(v_BxLxHxD), 3)

    # Key validity per class, and the window rule on class coordinates.
    valid_Bxdxn = pad_to_multiple(valid_BxL, d, axis=1, value=False)
    valid_Bxdxn = valid_Bxdxn.reshape(b, n, d).transpose(0, 2, 1)
    valid_BxdxNxK = neighbours(valid_Bxdxn, 2)  # padding -> False
    pos_q_NxC = jnp.arange(blocks * size).reshape(blocks, size)
    pos_k_NxK = neighbours(jnp.arange(n), 0)  # class index of each key
    in_range_NxK = neighbours(jnp.ones((n,), bool), 0)
    offset_NxCxK = pos_q_NxC[:, :, None] - pos_k_NxK[:, None, :]
    allowed_NxCxK = (jnp.abs(offset_NxCxK) <= half) & in_range_NxK[:, None]
    if causal:
      allowed_NxCxK &= offset_NxCxK >= 0
    allowed_dxNxCxK = jnp.broadcast_to(
      allowed_NxCxK[None], (d,) + allowed_NxCxK.shape
    )
    if g:
      # Global keys are added once below: drop them from the window.
      is_global_P = np.zeros(n * d, bool)
      is_global_P[glob_G] = True
      position_dxNxK = pos_k_NxK[None] * d + jnp.arange(d)[:, None, None]
      window_key_dxNxK = ~jnp.asarray(is_global_P)[position_dxNxK]
      allowed_dxNxCxK = allowed_dxNxCxK & window_key_dxNxK[:, :, None]
    allowed_BxdxHxNxCxK = (
      allowed_dxNxCxK[None, :, None] & valid_BxdxNxK[:, :, None, :, None]
    )

    if g:

      def global_keys(x_BxLxHxD):
        x_BxHxGxD = x_BxLxHxD[:, glob_G].transpose(0, 2, 1, 3)
        return jnp.broadcast_to(
          x_BxHxGxD[:, None, :, None], (b, d, h, blocks, g, dim)
        )

      k_BxdxHxNxKxD = jnp.concatenate(
        [k_BxdxHxNxKxD, global_keys(k_BxLxHxD)], axis=4
      )
      v_BxdxHxNxKxD = jnp.concatenate(
        [v_BxdxHxNxKxD, global_keys(v_BxLxHxD)], axis=4
      )
      glob_BxdxHxNxCxG = jnp.broadcast_to(
        valid_BxL[:, glob_G][:, None, None, None, None],
        (b, d, 1, blocks, size, g),
      )
      allowed_BxdxHxNxCxK = jnp.concatenate(
        [
          jnp.broadcast_to(allowed_BxdxHxNxCxK, (b, d, 1, blocks, size, span)),
          glob_BxdxHxNxCxG,
        ],
        axis=-1,
      )

    out_BxdxHxNxCxD = attend(
      q_BxdxHxNxCxD,
      k_BxdxHxNxKxD,
      v_BxdxHxNxKxD,
      allowed_BxdxHxNxCxK,
      scale=self.scale,
      rate=self.dropout_rate,
      key=key,
    )
    out_BxdxHxnxD = out_BxdxHxNxCxD.reshape(b, d, h, blocks * size, dim)
    out_BxnxdxHxD = out_BxdxHxnxD[:, :, :, :n].transpose(0, 3, 1, 2, 4)
    return out_BxnxdxHxD.reshape(b, n * d, h, dim)[:, :length]

  def _global_rows(
    self, q_BxLxHxD, k_BxLxHxD, v_BxLxHxD, valid_BxL, glob_G, key
  ):
    """Rows of the global queries glob_G, over all keys; [B, g, H, D]."""
    q_BxGxHxD = q_BxLxHxD[:, glob_G]
    if self.global_projections:
      q_BxGxHxD = self._map(
        q_BxGxHxD, self.global_q_HxDxD, self.global_q_bias_HxD
      )
      k_BxLxHxD = self._map(
        k_BxLxHxD, self.global_k_HxDxD, self.global_k_bias_HxD
      )
      v_BxLxHxD = self._map(
        v_BxLxHxD, self.global_v_HxDxD, self.global_v_bias_HxD
      )
    out_BxHxGxD = attend(
      q_BxGxHxD.transpose(0, 2, 1, 3),
      k_BxLxHxD.transpose(0, 2, 1, 3),
      v_BxLxHxD.transpose(0, 2, 1, 3),
      valid_BxL[:, None, None, :],
      scale=self.scale,
      rate=self.dropout_rate,
      key=key,
    )
    return out_BxHxGxD.transpose(0, 2, 1, 3)

  @staticmethod
  def _map(x_BxLxHxD, weight_HxDxD, bias_HxD):
    """Per-head affine map x -> x A + c, in x's dtype."""
    dtype = x_BxLxHxD.dtype
    y_BxLxHxD = jnp.einsum(
      'blhd,hde->blhe', x_BxLxHxD, weight_HxDxD[...].astype(dtype)
    )
    return y_BxLxHxD + bias_HxD[...].astype(dtype)
