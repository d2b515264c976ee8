"""Linformer: low-rank attention by projecting keys and values along length.

Wang et al., "Linformer: Self-Attention with Linear Complexity"
(arXiv 2006.04768).
  K' = E^T K, V' = F^T V    (E, F learned, [max_length, k], sliced to M rows)
  out = softmax(q K'^T / sqrt(D)) V'
The M keys and values are mixed into k projected slots; every query attends
to all k slots. Time O(L k D) per head, memory O(L k): no L x M array.

Options (`model.attention.<option>`):
  proj_length: k, the projected length (default 256, the paper's largest
    setting; the reference harness used 16: its text config asked for 32
    but never passed it).
  share_kv: one projection E = F for keys and values (default false).
  share_heads: one projection for all heads (default true, as the reference
    and the paper's "headwise sharing"); false gives each head its own
    E, F of shape [H, max_length, k].

E and F (attributes e_MxK, f_MxK; [H, max_length, k] per head) are
initialised like the reference's length-axis Dense layer:
LeCun normal (truncated, variance 1 / max_length), so a projected key has
about the scale of one key. No bias (the paper's E, F are plain matrices).

Padding: padded keys and values are zeroed before the projection, so they
contribute nothing to K' and V' (the reference harness ignored padding). A
query whose example has no real key sees K' = V' = 0 and gets zeros.

Exact limit: with proj_length = L = M and the first L rows of E and F the
identity (E = F = I when max_length = L) it equals softmax attention for
unpadded inputs. With padding, the identity
projection keeps one slot per padded position holding a zero key (logit 0)
and a zero value: it then equals softmax attention over all M positions of
inputs whose padded keys and values are zero vectors, not masked softmax.

Not causal (a projected slot mixes all positions): Mask.causal is refused.
The input length must be at most max_length (E and F have max_length rows).
Attention dropout acts on the weights over the k slots.
"""

from flax import nnx
import jax.numpy as jnp

from models.attention.base import (
  AttentionCore,
  attend,
  bool_option,
  int_option,
  refuse_causal,
)
from models.attention.registry import register
from models.errors import UserError


@register('linformer')
class LinformerAttention(AttentionCore):
  supports_causal = False
  needs_max_len = True
  rotary = None
  rotary_refusal = (
    'its length projection mixes the keys of all positions into '
    'slots that have no position'
  )

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
    proj_length=256,
    share_kv=False,
    share_heads=True,
  ):
    del layer_index
    int_option('linformer', 'proj_length', proj_length, 1, 256)
    bool_option('linformer', 'share_kv', share_kv)
    bool_option('linformer', 'share_heads', share_heads)
    self.proj_length = proj_length
    self.share_kv = share_kv
    self.share_heads = share_heads
    self.max_length = max_length
    self.dropout_rate = dropout_rate
    self.scale = head_dim**-0.5
    self.dtype = dtype
    if share_heads:
      shape, init = (max_length, proj_length), nnx.initializers.lecun_normal()
    else:
      shape = (num_heads, max_length, proj_length)
      init = nnx.initializers.lecun_normal(batch_axis=(0,))
    # Named for the shared case; [H, max_length, k] when share_heads=False.
    self.e_MxK = nnx.Param(init(rngs.params(), shape, jnp.float32))
    self.f_MxK = (
      None if share_kv else nnx.Param(init(rngs.params(), shape, jnp.float32))
    )

  def _check_length(self, length):
    if length > self.max_length:
      raise UserError(
        f'Linformer got length {length} but was built '
        f'for max_length {self.max_length}; raise --config.max_length.'
      )

  @property
  def projects_inputs(self):
    """Whether `project_inputs` applies (one E, F shared by the heads)."""
    return self.share_heads

  def project_inputs(self, k_in_BxMxE, v_in_BxMxE, mask):
    """(E^T k_in, F^T v_in) [B, k, E]: the length projection of the layer's
    key and value inputs, before their projections. A layer whose key and
    value projections have no bias projects these k rows, then calls
    __call__ with projected=True: E^T (x W) = (E^T x) W, so W multiplies k
    rows instead of M."""
    if not self.share_heads:
      raise ValueError('project_inputs needs share_heads=True')
    return self._along_length(k_in_BxMxE, v_in_BxMxE, mask)

  def __call__(
    self,
    q_BxLxHxD,
    k_BxMxHxD,
    v_BxMxHxD,
    mask,
    *,
    rngs=None,
    memory=None,
    projected=False,
  ):
    """projected: k and v are already the k projected slots [B, k, H, D]
    (the layer used `project_inputs`); otherwise the M keys and values."""
    del memory
    refuse_causal(self, mask, ' (its projections mix all positions)')
    self._check_length(q_BxLxHxD.shape[1])
    if not projected:
      k_BxMxHxD, v_BxMxHxD = self._along_length(k_BxMxHxD, v_BxMxHxD, mask)
    # Every projected slot is visible. An example with no real key has
    # K' = V' = 0: uniform weights over zero values, so its output is
    # exactly 0 without a mask (a mask would cost one more L x k select).
    out_BxHxLxD = attend(
      q_BxLxHxD.transpose(0, 2, 1, 3),
      k_BxMxHxD.transpose(0, 2, 1, 3),
      v_BxMxHxD.transpose(0, 2, 1, 3),
      True,
      scale=self.scale,
      rate=self.dropout_rate,
      key=rngs,
    )
    return out_BxHxLxD.transpose(0, 2, 1, 3).astype(self.dtype), {}

  def _along_length(self, k, v, mask):
    """(E^T k, F^T v) along axis 1 (M -> k), padded rows zeroed first (so
    they contribute nothing), in the inputs' dtype: [B, M, H, D] ->
    [B, k, H, D], or [B, M, E] -> [B, k, E] with E, F shared by the heads.

    A plain matmul in the compute dtype (XLA accumulates bf16 products in
    float32); the softmax over the k slots is float32 inside `attend`.
    """
    m = k.shape[1]
    self._check_length(m)
    if mask.key_padding_BxM is not None:
      real = mask.key_padding_BxM.reshape(
        mask.key_padding_BxM.shape + (1,) * (k.ndim - 2)
      )
      k, v = jnp.where(real, k, 0), jnp.where(real, v, 0)
    e = self.e_MxK[...]
    f = e if self.f_MxK is None else self.f_MxK[...]
    if self.share_heads:
      spec, e, f = 'bm...,mk->bk...', e[:m], f[:m]
    else:
      spec, e, f = 'bmhd,hmk->bkhd', e[:, :m], f[:, :m]
    return (
      jnp.einsum(spec, k, e.astype(k.dtype)),
      jnp.einsum(spec, v, f.astype(v.dtype)),
    )
