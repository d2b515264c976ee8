"""Sparse Transformer attention: strided and fixed factorised patterns.

Child et al., "Generating Long Sequences with Sparse Transformers"
(arXiv 1904.10509). Softmax attention restricted to a sparse pattern, with
stride l and summary width c (positions 0-based):

  strided: query i sees key j iff |i - j| < l or (i - j) mod l == 0
  fixed:   query i sees key j iff floor(i / l) == floor(j / l)
           or (j mod l) >= l - c
  mixed:   heads 0 .. H//2 - 1 strided, the others fixed (the paper's
           per-head combination of the two factorisations)

  out_i = softmax_j(q_i k_j / sqrt(D) | i sees j) v

One softmax over the union of a pattern's two parts (the paper's "merged
head" form of each factorisation; a key in both parts, such as j == i, counts
once); mixed is the paper's multi-head form. Causal masks add j <= i (the
paper's autoregressive setting); without one the patterns are bidirectional.

Layout, with the sequence padded inside the core to N = ceil(L / l) blocks of
l positions (the padding masked): strided gathers, per query block, its own
key block and its neighbours (only the previous one when causal; 3 l or 2 l
keys, masked by |i - j| < l), plus, per residue i mod l, the N keys of that
residue (the sequence reshaped to [N, l], attended along the first axis);
fixed gathers the own block (l keys) plus the c summary positions of every
block (N c keys, the same for every query). Time O(L (l + L / l) D) for
strided and O(L (l + L c / l) D) for fixed; memory O(L (l + L / l)) and
O(L (l + L c / l)), i.e. O(L sqrt L) when l is about sqrt L. No L x L array
is built.

The default stride is 64 (= sqrt(4096), the LRA's longest common length), a
constant, not a function of the input length; set `stride` near sqrt(L) for
the O(L sqrt L) cost (e.g. 32 at L = 1K). Exact limit: stride >= L makes
every pattern plain softmax attention (strided sees |i - j| < l everywhere,
fixed has one block).

Differences: the paper's blocksparse GPU kernels compute the same function
block by block. Here the gathered logits of a pattern's two parts are
concatenated along the key axis and normalised by one masked softmax,
`joint_weights` (the masking and float32 arithmetic of base.attend, which
takes one key set per query group: strided groups its parts differently, by
block and by residue, and sharing one key set would copy the keys per query,
D times the memory of the logits). Attention dropout applies to the joint
weights. The reference LRA harness (google-research/long-range-arena) forced
causal masks even in its encoders; here the pattern is bidirectional unless
Mask.causal.
"""

import jax
import jax.numpy as jnp

from errors import UserError
from models.attention.base import (
  AttentionCore,
  int_option,
  masked_softmax,
)
from models.attention.local import (
  check_self_attention,
  from_blocks,
  to_blocks,
  valid_blocks,
)
from models.attention.registry import register

PATTERNS = ('strided', 'fixed', 'mixed')


def joint_weights(logit_parts, allowed_parts, *, rate, key):
  """One masked softmax over several gathered logit sets (last axis).

  base.masked_softmax (base.attend's kernel) for keys gathered in
  differently shaped groups: logits (float32) and allowed masks are
  concatenated along the key axis, normalised together (a row with no
  visible key gets zeros, never NaN) and split back. Returns float32 weights.
  """
  shape = jnp.broadcast_shapes(*(p.shape[:-1] for p in logit_parts))
  widths = [p.shape[-1] for p in logit_parts]
  logits = jnp.concatenate(logit_parts, axis=-1)
  allowed = jnp.concatenate(
    [
      jnp.broadcast_to(a, shape + (w,))
      for a, w in zip(allowed_parts, widths, strict=True)
    ],
    axis=-1,
  )
  weights = masked_softmax(logits, allowed, rate, key)
  splits = [sum(widths[: i + 1]) for i in range(len(widths) - 1)]
  return jnp.split(weights, splits, axis=-1)


def _logits(spec, q, k, scale):
  return jnp.einsum(spec, q, k, preferred_element_type=jnp.float32) * scale


def other_blocks(n, causal):
  """bool [N, N]: key block m is another block than query block a (and,
  causal, an earlier one); keys of the own block are counted elsewhere."""
  a = jnp.arange(n)[:, None]
  m = jnp.arange(n)[None, :]
  return (m < a) if causal else (m != a)


def strided(
  q_BxLxHxD,
  k_BxLxHxD,
  v_BxLxHxD,
  valid_BxNxC,
  causal,
  stride,
  *,
  scale,
  rate,
  key,
):
  """|i - j| < l (neighbouring blocks) or (i - j) mod l == 0 (residue)."""
  length = q_BxLxHxD.shape[1]
  n = valid_BxNxC.shape[1]
  q_BxNxCxHxD, k_BxNxCxHxD, v_BxNxCxHxD = (
    to_blocks(t, stride) for t in (q_BxLxHxD, k_BxLxHxD, v_BxLxHxD)
  )

  # Band: query block a sees key blocks a - 1, a and, unless causal, a + 1
  # (3 l or 2 l keys), masked to |i - j| < l.
  def neighbours(x, fill=0):
    pad = [(0, 0)] * (x.ndim - 2)
    prev = jnp.pad(x[:, :-1], [(0, 0), (1, 0)] + pad, constant_values=fill)
    parts = [prev, x]
    if not causal:
      parts.append(
        jnp.pad(x[:, 1:], [(0, 0), (0, 1)] + pad, constant_values=fill)
      )
    return jnp.concatenate(parts, axis=2)

  kb_BxNxKxHxD = neighbours(k_BxNxCxHxD)
  vb_BxNxKxHxD = neighbours(v_BxNxCxHxD)
  band_BxNxHxCxK = _logits(
    'bnqhd,bnkhd->bnhqk', q_BxNxCxHxD, kb_BxNxKxHxD, scale
  )
  # Query t_q of block a is i = a l + t_q; key t of the band is
  # j = (a - 1) l + t, so i - j = l + t_q - t.
  t_q = jnp.arange(stride)[:, None]
  t = jnp.arange(kb_BxNxKxHxD.shape[2])[None, :]
  near_CxK = (t_q < t) & (t < 2 * stride + t_q)
  if causal:
    near_CxK = near_CxK & (t <= stride + t_q)
  band_ok_BxNx1xCxK = (
    neighbours(valid_BxNxC, False)[:, :, None, None, :] & near_CxK
  )

  # Column: query (a, r) sees keys (m, r) for every block m except its own
  # (j == i is in the band already); causal: m < a.
  col_BxNxHxCxN = _logits('bnqhd,bmqhd->bnhqm', q_BxNxCxHxD, k_BxNxCxHxD, scale)
  other_NxN = other_blocks(n, causal)
  col_ok_BxNx1xCxN = (
    valid_BxNxC.transpose(0, 2, 1)[:, None, None, :, :]
    & other_NxN[None, :, None, None, :]
  )

  w_band, w_col = joint_weights(
    [band_BxNxHxCxK, col_BxNxHxCxN],
    [band_ok_BxNx1xCxK, col_ok_BxNx1xCxN],
    rate=rate,
    key=key,
  )
  dt = v_BxLxHxD.dtype
  out_BxNxCxHxD = jnp.einsum(
    'bnhqk,bnkhd->bnqhd', w_band.astype(dt), vb_BxNxKxHxD
  ) + jnp.einsum('bnhqm,bmqhd->bnqhd', w_col.astype(dt), v_BxNxCxHxD)
  return from_blocks(out_BxNxCxHxD, length)


def fixed(
  q_BxLxHxD,
  k_BxLxHxD,
  v_BxLxHxD,
  valid_BxNxC,
  causal,
  stride,
  summary,
  *,
  scale,
  rate,
  key,
):
  """Own block or a summary position (j mod l >= l - c) of another block."""
  length = q_BxLxHxD.shape[1]
  b, n, _ = valid_BxNxC.shape
  q_BxNxCxHxD, k_BxNxCxHxD, v_BxNxCxHxD = (
    to_blocks(t, stride) for t in (q_BxLxHxD, k_BxLxHxD, v_BxLxHxD)
  )
  own_BxNxHxCxC = _logits('bnqhd,bnkhd->bnhqk', q_BxNxCxHxD, k_BxNxCxHxD, scale)
  own_ok_BxNx1xCxC = valid_BxNxC[:, :, None, None, :]
  if causal:
    own_ok_BxNx1xCxC = own_ok_BxNx1xCxC & jnp.tril(
      jnp.ones((stride, stride), bool)
    )

  # Summary keys: the last c positions of every block, S = N c keys shared
  # by all queries; a query skips its own block's (counted in `own`).
  hd = k_BxNxCxHxD.shape[3:]
  ks_BxSxHxD = k_BxNxCxHxD[:, :, stride - summary :].reshape(b, -1, *hd)
  vs_BxSxHxD = v_BxNxCxHxD[:, :, stride - summary :].reshape(b, -1, *hd)
  sum_BxNxHxCxS = _logits('bnqhd,bshd->bnhqs', q_BxNxCxHxD, ks_BxSxHxD, scale)
  other_NxN = other_blocks(n, causal)
  other_NxS = jnp.repeat(other_NxN, summary, axis=1)
  sum_ok_BxNx1x1xS = (
    valid_BxNxC[:, :, stride - summary :].reshape(b, 1, 1, 1, -1)
    & other_NxS[None, :, None, None, :]
  )

  w_own, w_sum = joint_weights(
    [own_BxNxHxCxC, sum_BxNxHxCxS],
    [own_ok_BxNx1xCxC, sum_ok_BxNx1x1xS],
    rate=rate,
    key=key,
  )
  dt = v_BxLxHxD.dtype
  out_BxNxCxHxD = jnp.einsum(
    'bnhqk,bnkhd->bnqhd', w_own.astype(dt), v_BxNxCxHxD
  ) + jnp.einsum('bnhqs,bshd->bnqhd', w_sum.astype(dt), vs_BxSxHxD)
  return from_blocks(out_BxNxCxHxD, length)


@register('sparse_transformer')
class SparseTransformerAttention(AttentionCore):
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
    pattern='mixed',
    stride=64,
    summary=8,
  ):
    del num_heads, max_length, rngs, layer_index
    if pattern not in PATTERNS:
      raise UserError(
        f'Unknown sparse_transformer pattern {pattern!r}; use one of '
        f'{", ".join(PATTERNS)}.'
      )
    int_option('sparse_transformer', 'stride', stride, 1, 64)
    if not isinstance(summary, int) or not 0 <= summary <= stride:
      raise UserError(
        f'sparse_transformer summary must be an integer from 0 to the stride '
        f'({stride}), got {summary!r}; set --config.model.attention.summary.'
      )
    self.pattern = pattern
    self.stride = stride
    self.summary = summary
    self.dropout_rate = dropout_rate
    self.scale = head_dim**-0.5
    self.dtype = dtype

  def __call__(
    self, q_BxLxHxD, k_BxMxHxD, v_BxMxHxD, mask, *, rngs=None, memory=None
  ):
    del memory
    b, length, h, _ = q_BxLxHxD.shape
    check_self_attention(self, length, k_BxMxHxD.shape[1])
    # A stride >= L is exact attention for both patterns, as is L itself:
    # no need to pad a short input up to the stride.
    stride = min(self.stride, length)
    summary = min(self.summary, stride)
    valid_BxNxC = valid_blocks(mask, b, length, stride)
    kw = dict(scale=self.scale, rate=self.dropout_rate)
    run_strided = lambda q, k, v, key: strided(  # noqa: E731
      q, k, v, valid_BxNxC, mask.causal, stride, key=key, **kw
    )
    run_fixed = lambda q, k, v, key: fixed(  # noqa: E731
      q, k, v, valid_BxNxC, mask.causal, stride, summary, key=key, **kw
    )
    qkv = (q_BxLxHxD, k_BxMxHxD, v_BxMxHxD)
    split = h // 2 if self.pattern == 'mixed' else 0
    if self.pattern == 'strided':
      out_BxLxHxD = run_strided(*qkv, rngs)
    elif self.pattern == 'fixed' or split == 0:
      out_BxLxHxD = run_fixed(*qkv, rngs)
    else:
      keys = [None, None] if rngs is None else list(jax.random.split(rngs))
      out_BxLxHxD = jnp.concatenate(
        [
          run_strided(*(t[:, :, :split] for t in qkv), keys[0]),
          run_fixed(*(t[:, :, split:] for t in qkv), keys[1]),
        ],
        axis=2,
      )
    return out_BxLxHxD.astype(self.dtype), {}
