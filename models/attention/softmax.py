"""Exact softmax attention: the oracle every efficient core is tested against.

Vaswani et al., "Attention Is All You Need" (arXiv 1706.03762).
  out = softmax(q k^T / sqrt(D) + mask) v
Time O(L M D) on every path. Memory O(L M) per head for the einsum path;
O(L) for the blocked path and for the fused one, which is cuDNN's flash
attention where `fused_kernel` (below) asks for it and the blocked path
everywhere else. It is its own exact limit.

Three implementations of one function:
  'einsum':  explicit logits, as LRA measured it; supports attention dropout.
  'fused':   cuDNN's flash attention (jax.nn.dot_product_attention) where it
             runs, else 'blocked'; no attention dropout.
  'blocked': the blocked online softmax of models/attention/blocked.py
             (Rabe & Staats, arXiv 2112.05682; FlashAttention-2's backward)
             on every backend: queries and keys in blocks, float32 running
             max and sum, a backward pass that recomputes each block's
             probabilities from the saved logsumexp; no attention dropout.

The fused path's kernel (`fused_kernel`): jax.nn.dot_product_attention left
to itself (implementation=None) writes attention out as XLA ops, L x M
logits included, on every backend (on an H200 the compiled step holds no
cuDNN call; on CPU it keeps and copies the [B, H, L, M] probabilities,
O(B H L M) memory). So
'auto' (the default) asks for cuDNN's flash attention by name where it
exists: an NVIDIA GPU, bfloat16/float16 compute and a head dim of at most
128; elsewhere 'xla', which is the blocked path (an XLA program of O(L)
memory, faster than the einsum path on CPU). 'cudnn' insists (one sentence
where it cannot run), 'xla' never uses it. cuDNN wants a head dim that is
a multiple of 8: any other D (Pathfinder's reference, qkv 16 over 4 heads:
D = 4) is zero-padded to the next multiple Dp (`cudnn_attention`) with the
scale 1/sqrt(D) of the true D; zero q/k columns add nothing to q.k and
zero v columns give zero output columns, cut off again, so this is exact
(values and gradients), at Dp/D times the q.k and v work (2x at D = 4).
Only the cuDNN request pads: the blocked path takes any D, and padding
there would only add work. cuDNN takes key padding as per-example lengths,
so the real keys must be a prefix (right padding, as every task pads); a
mask that is not one (Pathfinder with data.black_is_padding) turns the
output to NaN rather than into a silently different attention, and
build_model (models/classifier.py) refuses that combination before
training.

`relative` (set by `model.positions='relative'`, einsum only): the logits
are Transformer-XL's relative ones, (q_i + u).k_j + (q_i + v).W_R R_(i-j)
(models/attention/relative.py); zero W_R and u give plain softmax back.
"""

import jax
import jax.numpy as jnp

from models.attention.base import AttentionCore, dropout, visible_any_BxL
from models.attention.blocked import blocked_attention
from models.attention.registry import register
from models.attention.relative import RelativePositions
from models.errors import UserError

IMPLEMENTATIONS = ('einsum', 'fused', 'blocked')
FUSED_KERNELS = ('auto', 'xla', 'cudnn')
HALF = (jnp.bfloat16, jnp.float16)


def cudnn_head_dim(head_dim):
  """Dp: the head dim cuDNN runs, D rounded up to a multiple of 8."""
  return -(-head_dim // 8) * 8


def fused_kernel_for(requested, dtype, head_dim, backend=None):
  """'cudnn' or 'xla': the kernel the fused path asks for (module doc)."""
  if requested not in FUSED_KERNELS:
    raise UserError(
      f'Unknown fused_kernel {requested!r}; use one of '
      f'{", ".join(FUSED_KERNELS)}.'
    )
  backend = backend or jax.default_backend()
  why_not = None
  if backend != 'gpu':
    why_not = f'it needs an NVIDIA GPU (this backend is {backend})'
  elif jnp.dtype(dtype) not in [jnp.dtype(h) for h in HALF]:
    why_not = f'it needs bfloat16 or float16 compute (this is {dtype})'
  elif cudnn_head_dim(head_dim) > 128:
    why_not = f'it needs a head dim <= 128 (this is {head_dim})'
  if requested == 'cudnn' and why_not:
    raise UserError(
      f'fused_kernel=cudnn cannot run here: {why_not}; use '
      '--config.model.attention.fused_kernel=auto or xla.'
    )
  if requested == 'auto':
    return 'xla' if why_not else 'cudnn'
  return requested


@register('softmax')
class SoftmaxAttention(AttentionCore):
  supports_causal = True
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
    implementation='einsum',
    relative=False,
    fused_kernel='auto',
  ):
    del max_length, layer_index
    if implementation not in IMPLEMENTATIONS:
      raise UserError(
        f'Unknown softmax implementation {implementation!r}; use one of '
        f'{", ".join(IMPLEMENTATIONS)}.'
      )
    if implementation != 'einsum' and dropout_rate > 0:
      raise UserError(
        f'The {implementation} softmax path has no attention dropout; set '
        '--config.model.attention_dropout_rate=0.'
      )
    if relative and implementation != 'einsum':
      raise UserError(
        f'The {implementation} softmax path has no relative positions; set '
        '--config.model.attention.implementation=einsum or another '
        '--config.model.positions.'
      )
    self.rel = (
      RelativePositions(num_heads, head_dim, rngs=rngs) if relative else None
    )
    self.implementation = implementation
    self.kernel = None
    if implementation == 'fused':
      self.kernel = fused_kernel_for(fused_kernel, dtype, head_dim)
    self.dropout_rate = dropout_rate
    self.scale = head_dim**-0.5
    self.dtype = dtype

  def __call__(
    self, q_BxLxHxD, k_BxMxHxD, v_BxMxHxD, mask, *, rngs=None, memory=None
  ):
    del memory
    b, length, _, _ = q_BxLxHxD.shape
    m = k_BxMxHxD.shape[1]
    visible_BxL = visible_any_BxL(mask, b, length, m)
    if self.implementation == 'fused':
      out_BxLxHxD = self._fused(q_BxLxHxD, k_BxMxHxD, v_BxMxHxD, mask)
    elif self.implementation == 'blocked':
      out_BxLxHxD = self._blocked(q_BxLxHxD, k_BxMxHxD, v_BxMxHxD, mask)
    else:
      out_BxLxHxD = self._einsum(q_BxLxHxD, k_BxMxHxD, v_BxMxHxD, mask, rngs)
    out_BxLxHxD = jnp.where(visible_BxL[:, :, None, None], out_BxLxHxD, 0)
    return out_BxLxHxD.astype(self.dtype), {}

  def _einsum(self, q_BxLxHxD, k_BxMxHxD, v_BxMxHxD, mask, key):
    if self.rel is not None:
      logits_BxHxLxM = self.rel.logits(q_BxLxHxD, k_BxMxHxD) * self.scale
    else:
      logits_BxHxLxM = (
        jnp.einsum(
          'blhd,bmhd->bhlm',
          q_BxLxHxD,
          k_BxMxHxD,
          preferred_element_type=jnp.float32,
        )
        * self.scale
      )
    allowed = dense_allowed(mask, q_BxLxHxD.shape[1], k_BxMxHxD.shape[1])
    if allowed is not None:
      logits_BxHxLxM = jnp.where(allowed, logits_BxHxLxM, -1e30)
    weights_BxHxLxM = jax.nn.softmax(logits_BxHxLxM, axis=-1)
    weights_BxHxLxM = dropout(weights_BxHxLxM, self.dropout_rate, key)
    return jnp.einsum(
      'bhlm,bmhd->blhd', weights_BxHxLxM.astype(v_BxMxHxD.dtype), v_BxMxHxD
    )

  def _fused(self, q_BxLxHxD, k_BxMxHxD, v_BxMxHxD, mask):
    if self.kernel == 'cudnn':
      return self._cudnn(q_BxLxHxD, k_BxMxHxD, v_BxMxHxD, mask)
    return self._blocked(q_BxLxHxD, k_BxMxHxD, v_BxMxHxD, mask)

  def _blocked(self, q_BxLxHxD, k_BxMxHxD, v_BxMxHxD, mask):
    return blocked_attention(
      q_BxLxHxD,
      k_BxMxHxD,
      v_BxMxHxD,
      mask.key_padding_BxM,
      causal=mask.causal,
      scale=self.scale,
    )

  def _cudnn(self, q_BxLxHxD, k_BxMxHxD, v_BxMxHxD, mask):
    """cuDNN flash attention; key padding as lengths (a prefix of keys)."""
    lengths_B, prefix_B = None, None
    if mask.key_padding_BxM is not None:
      real_BxM = jnp.broadcast_to(
        mask.key_padding_BxM, (q_BxLxHxD.shape[0], k_BxMxHxD.shape[1])
      )
      lengths_B = real_BxM.sum(axis=-1, dtype=jnp.int32)
      positions_M = jnp.arange(real_BxM.shape[-1])
      prefix_B = jnp.all(
        real_BxM == (positions_M[None, :] < lengths_B[:, None]), axis=-1
      )
    out_BxLxHxD = cudnn_attention(
      q_BxLxHxD,
      k_BxMxHxD,
      v_BxMxHxD,
      lengths_B,
      causal=mask.causal,
      implementation='cudnn',
    )
    if prefix_B is not None:
      out_BxLxHxD = jnp.where(
        prefix_B[:, None, None, None], out_BxLxHxD, jnp.nan
      )
    return out_BxLxHxD


def cudnn_attention(
  q_BxLxHxD, k_BxMxHxD, v_BxMxHxD, lengths_B, *, causal, implementation
):
  """Softmax attention in the shapes cuDNN runs; exact for any D <= 128.

  q, k and v are zero-padded along D to Dp (`cudnn_head_dim`) and the scale
  is 1/sqrt(D) of the true D: a zero column of q and k adds nothing to any
  q.k, a zero column of v is a zero column of the output, which is cut
  (the gradients of the real columns are untouched; those of the pad are
  zero and dropped by the pad's transpose). Sequence lengths as in
  `even_length_attention`. `implementation='xla'` takes the same arguments
  on any backend: that is how the tests check it without a GPU.
  """
  d = q_BxLxHxD.shape[-1]
  extra = cudnn_head_dim(d) - d

  def pad(x_BxNxHxD):
    if not extra:
      return x_BxNxHxD
    return jnp.pad(x_BxNxHxD, ((0, 0), (0, 0), (0, 0), (0, extra)))

  out_BxLxHxDp = even_length_attention(
    pad(q_BxLxHxD),
    pad(k_BxMxHxD),
    pad(v_BxMxHxD),
    lengths_B,
    causal=causal,
    scale=d**-0.5,
    implementation=implementation,
  )
  return out_BxLxHxDp[..., :d]


def even_length_attention(
  q_BxLxHxD, k_BxMxHxD, v_BxMxHxD, lengths_B, *, causal, scale, implementation
):
  """jax.nn.dot_product_attention with the sequences padded to even lengths.

  cuDNN's training kernels refuse odd lengths (measured on an H200: 'Unsupported
  sequence length Q 1025, KV 1025' for 1,024 tokens + CLS). One zero row is
  appended to q, k and v where a length is odd; the extra key lies beyond
  every example's key length (lengths_B; all M when None), so no query sees
  it (causal masks stay top-left aligned), and the extra query's row is cut.
  """
  b, length = q_BxLxHxD.shape[:2]
  m = k_BxMxHxD.shape[1]
  extra_q, extra_k = length % 2, m % 2
  if extra_k and lengths_B is None:
    lengths_B = jnp.full((b,), m, jnp.int32)

  def pad(x, extra):
    return jnp.pad(x, ((0, 0), (0, extra), (0, 0), (0, 0))) if extra else x

  out_BxLxHxD = jax.nn.dot_product_attention(
    pad(q_BxLxHxD, extra_q),
    pad(k_BxMxHxD, extra_k),
    pad(v_BxMxHxD, extra_k),
    key_value_seq_lengths=lengths_B,
    is_causal=causal,
    scale=scale,
    implementation=implementation,
  )
  return out_BxLxHxD[:, :length]


def dense_allowed(mask, length_q, length_k):
  """bool[B|1, 1, L, M] of allowed (query, key) pairs, or None (all).

  Only for the exact core: efficient cores never build an L x M array.
  """
  allowed = None
  if mask.key_padding_BxM is not None:
    allowed = mask.key_padding_BxM[:, None, None, :]
  if mask.causal:
    causal = jnp.tril(jnp.ones((length_q, length_k), bool))[None, None]
    allowed = causal if allowed is None else allowed & causal
  return allowed
