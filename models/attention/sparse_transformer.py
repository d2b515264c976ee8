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

Each factorisation has two parts (the paper's A(1), A(2)): strided
A(1) = {j : |i - j| < l}, A(2) = {j : (i - j) mod l == 0}; fixed
A(1) = {j : floor(j / l) == floor(i / l)}, A(2) = {j : j mod l >= l - c}.
`combine` is how the paper ("Factorized attention heads") puts the two parts
together, the three forms it lists:

  merged (default): every head attends to A(1) | A(2), one softmax over the
    union (a key in both parts, such as j == i, counts once);
  interleaved: one part per residual block, by the constructor's
    layer_index: even layers attend to A(1), odd layers to A(2);
  heads: within each factorisation's heads the first half (H'//2 of its H'
    heads) attends to A(1), the rest to A(2); the head outputs are
    concatenated as usual. With mixed, each half (strided, fixed) is split
    again: four head groups.

The default is merged because that is what the reference LRA harness ran
(lra_benchmarks/models/sparse_transformer: one dense mask, the logical or of
the parts' masks) and what this core computed before `combine`.
Causal masks add j <= i (the paper's autoregressive setting); without one
the patterns are bidirectional. A query with no visible key (possible in
A(2) alone: causal fixed A(2) before the first summary position) outputs
zeros.

Layout, with the sequence padded inside the core to N = ceil(L / l) blocks of
l positions (the padding masked): strided gathers, per query block, its own
key block and its neighbours (only the previous one when causal; 3 l or 2 l
keys, masked by |i - j| < l), plus, per residue i mod l, the N keys of that
residue (the sequence reshaped to [N, l], attended along the first axis);
fixed gathers the own block (l keys) plus the c summary positions of every
block (N c keys, the same for every query). Time O(L (l + L / l) D) for
strided and O(L (l + L c / l) D) for fixed; memory O(L (l + L / l)) and
O(L (l + L c / l)), i.e. O(L sqrt L) when l is about sqrt L. No L x L array
is built. The parts alone cost no more than the union: A(1) alone is the
band (strided, 3 l or 2 l keys) or the own block (fixed, l keys), A(2) alone
the residue column (strided, N keys, own block included) or the summary keys
(fixed, N c keys, the query's own block's included, masked causally by
position).

The default stride is 64 (= sqrt(4096), the LRA's longest common length), a
constant, not a function of the input length; set `stride` near sqrt(L) for
the O(L sqrt L) cost (e.g. 32 at L = 1K). Exact limit: stride >= L makes
every merged pattern, and A(1) alone, plain softmax attention (strided sees
|i - j| < l everywhere, fixed has one block); A(2) alone then sees j == i
only (strided) or the positions l - c .. l - 1 that exist (fixed; none when
l - c >= L).

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

import functools

import jax
import jax.numpy as jnp

from models.attention.base import (
  AttentionCore,
  int_option,
  masked_softmax,
  recomputed,
)
from models.attention.local import (
  check_self_attention,
  from_blocks,
  to_blocks,
  valid_blocks,
)
from models.attention.registry import register
from models.errors import UserError

PATTERNS = ('strided', 'fixed', 'mixed')
COMBINES = ('merged', 'interleaved', 'heads')
# Which part of a factorisation a head group attends to: the union, A(1)
# alone or A(2) alone.
UNION, PART1, PART2 = 0, 1, 2


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


def other_blocks(n, causal, own=False):
  """bool [N, N]: key block m is another block than query block a (and,
  causal, an earlier one); keys of the own block are counted elsewhere.
  own=True: the own block too (m <= a causal, every m otherwise)."""
  a = jnp.arange(n)[:, None]
  m = jnp.arange(n)[None, :]
  if own:
    return (m <= a) if causal else jnp.ones((n, n), bool)
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
  part=UNION,
):
  """|i - j| < l (neighbouring blocks) or (i - j) mod l == 0 (residue).

  part: UNION (both), PART1 (the band |i - j| < l alone) or PART2 (the
  residue column alone, j == i included).
  """
  length = q_BxLxHxD.shape[1]
  n = valid_BxNxC.shape[1]
  q_BxNxCxHxD, k_BxNxCxHxD, v_BxNxCxHxD = (
    to_blocks(t, stride) for t in (q_BxLxHxD, k_BxLxHxD, v_BxLxHxD)
  )
  dt = v_BxLxHxD.dtype
  if part == PART2:
    return from_blocks(
      residues(
        q_BxNxCxHxD,
        k_BxNxCxHxD,
        v_BxNxCxHxD,
        valid_BxNxC,
        causal,
        scale,
        rate=rate,
        key=key,
      ),
      length,
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
  if part == PART1:
    (w_band,) = joint_weights(
      [band_BxNxHxCxK], [band_ok_BxNx1xCxK], rate=rate, key=key
    )
    out_BxNxCxHxD = jnp.einsum(
      'bnhqk,bnkhd->bnqhd', w_band.astype(dt), vb_BxNxKxHxD
    )
    return from_blocks(out_BxNxCxHxD, length)

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
  out_BxNxCxHxD = jnp.einsum(
    'bnhqk,bnkhd->bnqhd', w_band.astype(dt), vb_BxNxKxHxD
  ) + jnp.einsum('bnhqm,bmqhd->bnqhd', w_col.astype(dt), v_BxNxCxHxD)
  return from_blocks(out_BxNxCxHxD, length)


def residues(
  q_BxNxCxHxD,
  k_BxNxCxHxD,
  v_BxNxCxHxD,
  valid_BxNxC,
  causal,
  scale,
  *,
  rate,
  key,
):
  """Strided A(2) alone: query (a, r) sees keys (m, r) of every block m
  (causal: m <= a), its own position included. -> out [B, N, C, H, D]."""
  n = valid_BxNxC.shape[1]
  col_BxNxHxCxN = _logits('bnqhd,bmqhd->bnhqm', q_BxNxCxHxD, k_BxNxCxHxD, scale)
  col_ok_BxNx1xCxN = (
    valid_BxNxC.transpose(0, 2, 1)[:, None, None, :, :]
    & other_blocks(n, causal, own=True)[None, :, None, None, :]
  )
  (w_col,) = joint_weights(
    [col_BxNxHxCxN], [col_ok_BxNx1xCxN], rate=rate, key=key
  )
  return jnp.einsum(
    'bnhqm,bmqhd->bnqhd', w_col.astype(v_BxNxCxHxD.dtype), v_BxNxCxHxD
  )


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
  part=UNION,
):
  """Own block or a summary position (j mod l >= l - c) of another block.

  part: UNION (both), PART1 (the own block alone) or PART2 (the summary
  positions alone, the own block's included: j <= i when causal).
  """
  length = q_BxLxHxD.shape[1]
  b, n, _ = valid_BxNxC.shape
  q_BxNxCxHxD, k_BxNxCxHxD, v_BxNxCxHxD = (
    to_blocks(t, stride) for t in (q_BxLxHxD, k_BxLxHxD, v_BxLxHxD)
  )
  logit_parts, ok_parts, value_parts = [], [], []
  if part != PART2:
    own_BxNxHxCxC = _logits(
      'bnqhd,bnkhd->bnhqk', q_BxNxCxHxD, k_BxNxCxHxD, scale
    )
    own_ok_BxNx1xCxC = valid_BxNxC[:, :, None, None, :]
    if causal:
      own_ok_BxNx1xCxC = own_ok_BxNx1xCxC & jnp.tril(
        jnp.ones((stride, stride), bool)
      )
    logit_parts.append(own_BxNxHxCxC)
    ok_parts.append(own_ok_BxNx1xCxC)
    value_parts.append(('bnhqk,bnkhd->bnqhd', v_BxNxCxHxD))

  if part != PART1:
    # Summary keys: the last c positions of every block, S = N c keys
    # shared by all queries. In the union a query skips its own block's
    # (counted in `own`); alone, causal, it sees those with j <= i.
    hd = k_BxNxCxHxD.shape[3:]
    ks_BxSxHxD = k_BxNxCxHxD[:, :, stride - summary :].reshape(b, -1, *hd)
    vs_BxSxHxD = v_BxNxCxHxD[:, :, stride - summary :].reshape(b, -1, *hd)
    sum_BxNxHxCxS = _logits('bnqhd,bshd->bnhqs', q_BxNxCxHxD, ks_BxSxHxD, scale)
    valid_Bx1x1x1xS = valid_BxNxC[:, :, stride - summary :].reshape(
      b, 1, 1, 1, -1
    )
    # sum_ok: [B, N, 1, 1 or C, S] (per query position only when causal).
    if part == UNION:
      other_NxS = jnp.repeat(other_blocks(n, causal), summary, axis=1)
      sum_ok_BxNx1xCxS = valid_Bx1x1x1xS & other_NxS[None, :, None, None, :]
    elif causal:
      pos_NxC = jnp.arange(n * stride).reshape(n, stride)
      pos_S = pos_NxC[:, stride - summary :].reshape(-1)
      earlier_NxCxS = pos_S[None, None, :] <= pos_NxC[:, :, None]
      sum_ok_BxNx1xCxS = valid_Bx1x1x1xS & earlier_NxCxS[None, :, None]
    else:
      sum_ok_BxNx1xCxS = valid_Bx1x1x1xS
    logit_parts.append(sum_BxNxHxCxS)
    ok_parts.append(sum_ok_BxNx1xCxS)
    value_parts.append(('bnhqs,bshd->bnqhd', vs_BxSxHxD))

  weights = joint_weights(logit_parts, ok_parts, rate=rate, key=key)
  dt = v_BxLxHxD.dtype
  out_BxNxCxHxD = sum(
    jnp.einsum(spec, w.astype(dt), v)
    for w, (spec, v) in zip(weights, value_parts, strict=True)
  )
  return from_blocks(out_BxNxCxHxD, length)


def head_groups(pattern, combine, heads, layer_index):
  """[(pattern, part, first head, end head)]: which pattern and part each
  contiguous group of heads attends to (empty groups left out)."""
  if pattern == 'mixed':
    half = heads // 2
    groups = [('strided', 0, half), ('fixed', half, heads)]
  else:
    groups = [(pattern, 0, heads)]
  plan = []
  for name, start, end in groups:
    if combine == 'merged':
      plan.append((name, UNION, start, end))
    elif combine == 'interleaved':
      plan.append((name, PART1 if layer_index % 2 == 0 else PART2, start, end))
    else:
      mid = start + (end - start) // 2
      plan += [(name, PART1, start, mid), (name, PART2, mid, end)]
  return [g for g in plan if g[3] > g[2]]


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
    combine='merged',
  ):
    del max_length, rngs
    if pattern not in PATTERNS:
      raise UserError(
        f'Unknown sparse_transformer pattern {pattern!r}; use one of '
        f'{", ".join(PATTERNS)}.'
      )
    if combine not in COMBINES:
      raise UserError(
        f'Unknown sparse_transformer combine {combine!r}; use one of '
        f'{", ".join(COMBINES)} (--config.model.attention.combine).'
      )
    int_option('sparse_transformer', 'stride', stride, 1, 64)
    if not isinstance(summary, int) or not 0 <= summary <= stride:
      raise UserError(
        f'sparse_transformer summary must be an integer from 0 to the stride '
        f'({stride}), got {summary!r}; set --config.model.attention.summary.'
      )
    need = 4 if pattern == 'mixed' else 2
    if combine == 'heads' and num_heads < need:
      raise UserError(
        f"sparse_transformer combine='heads' with pattern {pattern!r} needs "
        f'at least {need} heads (one per part of each factorisation), got '
        f'{num_heads}; raise --config.model.num_heads or use another combine.'
      )
    self.pattern = pattern
    self.stride = stride
    self.summary = summary
    self.combine = combine
    # Only interleaved depends on the layer (its parity): the other forms
    # keep every layer's core alike (model.scan_layers stacks them).
    self.layer_parity = layer_index % 2 if combine == 'interleaved' else 0
    self.dropout_rate = dropout_rate
    self.scale = head_dim**-0.5
    self.dtype = dtype

  def __call__(
    self, q_BxLxHxD, k_BxMxHxD, v_BxMxHxD, mask, *, rngs=None, memory=None
  ):
    del memory
    b, length, h, _ = q_BxLxHxD.shape
    check_self_attention(self, length, k_BxMxHxD.shape[1])
    groups = head_groups(self.pattern, self.combine, h, self.layer_parity)
    if rngs is None:
      keys = [None] * len(groups)
    elif len(groups) == 1:
      keys = [rngs]
    else:
      keys = list(jax.random.split(rngs, len(groups)))
    kw = dict(scale=self.scale, rate=self.dropout_rate)
    outs = []  # one [B, L, H, D] per head group (H: its heads)
    for (name, part, start, end), key in zip(groups, keys, strict=True):
      # A stride >= L is exact attention for the union and for A(1), as is
      # L itself, and leaves strided A(2) at j == i: no need to pad a short
      # input up to the stride. Fixed A(2) alone depends on the stride (its
      # summary positions l - c .. l - 1): kept.
      stride = self.stride
      if not (name == 'fixed' and part == PART2):
        stride = min(stride, length)
      summary = min(self.summary, stride)
      valid_BxNxC = valid_blocks(mask, b, length, stride)
      qkv = (t[:, :, start:end] for t in (q_BxLxHxD, k_BxMxHxD, v_BxMxHxD))
      if name == 'strided':
        fn = functools.partial(
          strided, causal=mask.causal, stride=stride, part=part, **kw
        )
      else:
        fn = functools.partial(
          fixed,
          causal=mask.causal,
          stride=stride,
          summary=summary,
          part=part,
          **kw,
        )
      part_BxLxHxD = recomputed(
        lambda q, k, v, valid, key, fn=fn: fn(q, k, v, valid, key=key),
        *qkv,
        valid_BxNxC,
        key,
      )
      outs.append(part_BxLxHxD)
    out_BxLxHxD = outs[0] if len(outs) == 1 else jnp.concatenate(outs, axis=2)
    return out_BxLxHxD.astype(self.dtype), {}
