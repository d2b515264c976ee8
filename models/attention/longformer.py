"""Longformer attention: a (dilated) sliding window plus global tokens.

Beltagy, Peters and Cohan, "Longformer: The Long-Document Transformer"
(arXiv 2004.05150).

Query i sees key j iff |i - j| <= (w / 2) * d and (i - j) mod d == 0 (the
sliding window: w / 2 keys on each side plus the query's own position, every
d-th position, as in the authors' Hugging Face implementation), or j < g (every
query sees the g global tokens), and a global query (i < g) sees every key.
Padding and the causal flag apply on top. In words: a non-global query takes
one softmax over its window and the global keys (a global key inside the
window counts once); a global query takes a softmax over all keys.

Layout, with no L x L array anywhere: the positions are split into their d
residue classes mod d (a dilated window is a contiguous window of half-width
w / 2 inside one class); each class is cut into query blocks of
C = ceil(w / 4) positions and every block gathers the keys of its own and the
two neighbouring blocks on each side (5 C ~ 1.25 w keys, masked to the
window's w + 1), plus the g global keys; one joint masked softmax (`attend`)
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
carry). With global_tokens = 0 the maps are not created.
global_projections=false: the global path reuses q, k, v; no parameters.

Exact limit: window >= 2 (L - 1) (e.g. w >= 2 L) with dilation 1 equals plain
softmax attention for any global_tokens (with global_projections=false, or
true at initialisation); causal with global_tokens = 0 likewise equals causal
softmax attention.

Causal masks are supported only without global tokens (a global query sees
every key); with global_tokens > 0 a causal call raises a UserError.

Differences from the reference harness (google-research/long-range-arena): it
built dense L x L masks and ran full attention (quadratic); its even window had
w / 2 - 1 keys on the left and w / 2 on the right (w keys), here w + 1 as in
the Hugging Face implementation; it had no dilation; its encoder never passed a
global mask, so its runs had no global tokens (the global projections were
built but unused), here the first g positions are global (default 1, the CLS
token when pooling is `cls`). A global_tokens value larger than L makes every
position global (exact attention with the global maps). Queries and keys must
have the same length (self-attention).
"""

from flax import nnx
import jax
import jax.numpy as jnp

from errors import UserError
from models.attention.base import (
  AttentionCore,
  attend,
  bool_option,
  int_option,
  key_valid_BxM,
  pad_to_multiple,
  refuse_causal,
)
from models.attention.registry import register

# Query blocks are half-window / SIDE_BLOCKS long and gather SIDE_BLOCKS
# neighbouring blocks on each side: 2 gave the least compiled memory at
# w = 512, L = 4096 (1 wastes more logits, 4 copies keys and values more).
SIDE_BLOCKS = 2


@register('longformer')
class LongformerAttention(AttentionCore):
  supports_causal = True  # only with global_tokens = 0, checked per call
  # Global rows with global_projections: A_q, A_k act on rotated vectors
  # (relative at initialisation, when they are the identity).
  rotary = 'scores'

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
    window=512,
    dilation=1,
    global_tokens=1,
    global_projections=True,
  ):
    del max_length, rngs, layer_index
    if int_option('longformer', 'window', window, 2, 512) % 2:
      raise UserError(
        f'Longformer window must be an even integer >= 2 (w / 2 keys on '
        f'each side), got {window!r}.'
      )
    int_option('longformer', 'dilation', dilation, 1, 1)
    int_option('longformer', 'global_tokens', global_tokens, 0, 1)
    bool_option('longformer', 'global_projections', global_projections)
    self.window = window
    self.dilation = dilation
    self.global_tokens = global_tokens
    self.global_projections = global_projections
    self.dropout_rate = dropout_rate
    self.scale = head_dim**-0.5
    self.dtype = dtype
    if global_projections and global_tokens > 0:
      # A fresh array per parameter: shared buffers cannot be donated.
      eye = lambda: nnx.Param(  # noqa: E731
        jnp.tile(jnp.eye(head_dim, dtype=jnp.float32), (num_heads, 1, 1))
      )
      zero = lambda: nnx.Param(jnp.zeros((num_heads, head_dim), jnp.float32))  # noqa: E731
      self.global_q_HxDxD = eye()
      self.global_k_HxDxD = eye()
      self.global_v_HxDxD = eye()
      self.global_q_bias_HxD = zero()
      self.global_k_bias_HxD = zero()
      self.global_v_bias_HxD = zero()

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
    g = min(self.global_tokens, length)
    if g:
      refuse_causal(self, mask, ' with global_tokens > 0 (set it to 0)')
    key_band = key_glob = None
    if rngs is not None:
      key_band, key_glob = jax.random.split(rngs)
    valid_BxL = key_valid_BxM(mask, b, length)
    out_BxLxHxD = self._band(
      q_BxLxHxD, k_BxMxHxD, v_BxMxHxD, valid_BxL, g, mask.causal, key_band
    )
    if g:
      glob_BxGxHxD = self._global_rows(
        q_BxLxHxD, k_BxMxHxD, v_BxMxHxD, valid_BxL, g, key_glob
      )
      out_BxLxHxD = jnp.concatenate(
        [glob_BxGxHxD.astype(out_BxLxHxD.dtype), out_BxLxHxD[:, g:]], axis=1
      )
    return out_BxLxHxD.astype(self.dtype), {}

  def _band(self, q_BxLxHxD, k_BxLxHxD, v_BxLxHxD, valid_BxL, g, causal, key):
    """Window (+ global keys) attention of every query; [B, L, H, D]."""
    b, length, h, dim = q_BxLxHxD.shape
    d = self.dilation
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
    # Global keys are added once below: drop them from the window.
    residue_d = jnp.arange(d)
    position_dxNxK = pos_k_NxK[None] * d + residue_d[:, None, None]
    allowed_dxNxCxK = allowed_NxCxK[None] & (position_dxNxK >= g)[:, :, None]
    allowed_BxdxHxNxCxK = (
      allowed_dxNxCxK[None, :, None] & valid_BxdxNxK[:, :, None, :, None]
    )

    if g:
      k_glob_BxdxHxNxGxD = jnp.broadcast_to(
        k_BxLxHxD[:, :g].transpose(0, 2, 1, 3)[:, None, :, None],
        (b, d, h, blocks, g, dim),
      )
      v_glob_BxdxHxNxGxD = jnp.broadcast_to(
        v_BxLxHxD[:, :g].transpose(0, 2, 1, 3)[:, None, :, None],
        (b, d, h, blocks, g, dim),
      )
      k_BxdxHxNxKxD = jnp.concatenate(
        [k_BxdxHxNxKxD, k_glob_BxdxHxNxGxD], axis=4
      )
      v_BxdxHxNxKxD = jnp.concatenate(
        [v_BxdxHxNxKxD, v_glob_BxdxHxNxGxD], axis=4
      )
      glob_BxdxHxNxCxG = jnp.broadcast_to(
        valid_BxL[:, None, None, None, None, :g],
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

  def _global_rows(self, q_BxLxHxD, k_BxLxHxD, v_BxLxHxD, valid_BxL, g, key):
    """Rows of the g global queries, over all keys; [B, g, H, D]."""
    q_BxGxHxD = q_BxLxHxD[:, :g]
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
