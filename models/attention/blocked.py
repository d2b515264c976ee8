"""Exact softmax attention in O(L) memory: blocked online softmax.

Rabe & Staats, "Self-attention does not need O(n^2) memory" (arXiv
2112.05682); the backward pass of FlashAttention (Dao et al., arXiv
2205.14135) as FlashAttention-2 writes it.

Queries come in blocks of Cq rows, keys in blocks of Ck. The forward pass
walks, for each query block, over the key blocks it may see, keeping a
running row max m, row sum l and unnormalised output in float32:
  s = q k^T * scale,  m' = max(m, rowmax s),  p = exp(s - m'),
  l' = l exp(m - m') + rowsum p,  acc' = acc exp(m - m') + p v,
and ends with out = acc / l and the row's logsumexp lse = m + log l. Only
O(Cq Ck) logits exist at a time. The backward pass (a jax.custom_vjp)
stores no probabilities: it recomputes each block's P = exp(s - lse) from
the saved lse and forms
  dV = P^T dO,  dP = dO V^T,  dS = P (.) (dP - rowsum(dO (.) O)),
  dQ = dS K * scale,  dK = dS^T Q * scale,
walking over key blocks (dK, dV of one block accumulate in the loop carry)
and, inside, over query blocks (dQ, O(L D), is updated in place). It works
on the transposed blocks S^T = K Q^T [Ck, Cq] and accumulates dQ^T = K^T
dS^T, so that every product is a plain one for XLA's CPU backend (one that
contracts its left operand's rows, P^T dO written as such, is off its
fast matmul path).

Masks: key padding (bool[B, M], True = real) and a causal mask (query i
sees keys j <= i, top-left aligned as `dense_allowed` in softmax.py). With
a causal mask, key blocks entirely above the diagonal are never visited,
and only the blocks the diagonal crosses are masked elementwise (the others
are walked by a second, unmasked loop). Lengths that are not multiples of
the block are padded internally; padded keys are masked and padded query
rows cut. Masked logits are -inf and the running max is taken as 0 while
a row has seen no key, so a query with no visible key gets l = 0, output
zeros (never NaN) and zero gradients.

Inputs of any float dtype are computed in float32; the output has q's
dtype. Loops are lax.scan / fori_loop (nothing unrolled over L), so the
compiled program's size does not depend on L.
"""

import functools
from typing import NamedTuple

import jax
from jax import lax
import jax.numpy as jnp

# Block sizes: on a CPU every pair from 128 to 1024 runs about alike
# (docs/benchmark.md has the blocked path against the einsum one); 256 x
# 512 keeps the causal skip fine-grained.
BLOCK_Q = 256
BLOCK_K = 512


def blocked_attention(
  q_BxLxHxD,
  k_BxMxHxD,
  v_BxMxHxD,
  key_padding_BxM=None,
  *,
  causal=False,
  scale=None,
  block_q=BLOCK_Q,
  block_k=BLOCK_K,
):
  """softmax(q k^T * scale | masks) v, exact, in O(L) memory (module doc).

  Args:
    q_BxLxHxD, k_BxMxHxD, v_BxMxHxD: queries, keys and values.
    key_padding_BxM: bool[B | 1, M], True for a real key, or None (all).
    causal: query i sees keys j <= i only.
    scale: the logits' factor; None for 1/sqrt(D).
    block_q, block_k: query and key block sizes (cut to L and M).

  Returns:
    out_BxLxHxD in q's dtype; zeros for a query with no visible key.
  """
  b, length, h, d = q_BxLxHxD.shape
  m = k_BxMxHxD.shape[1]
  if k_BxMxHxD.shape != (b, m, h, d) or v_BxMxHxD.shape[:3] != (b, m, h):
    raise ValueError(
      f'q, k, v shapes {q_BxLxHxD.shape}, {k_BxMxHxD.shape}, '
      f'{v_BxMxHxD.shape} are not [B, L, H, D], [B, M, H, D], [B, M, H, Dv]'
    )
  if min(block_q, block_k) < 1:
    raise ValueError(f'block sizes must be >= 1, got {block_q}, {block_k}')
  scale = d**-0.5 if scale is None else scale
  cq, ck = min(block_q, length), min(block_k, m)
  nq, nk = -(-length // cq), -(-m // ck)

  real_NxBxC = None
  if key_padding_BxM is not None or nk * ck != m:
    real_BxM = jnp.ones((b, m), bool)
    if key_padding_BxM is not None:
      real_BxM = jnp.broadcast_to(key_padding_BxM.astype(bool), (b, m))
    real_BxM = jnp.pad(real_BxM, ((0, 0), (0, nk * ck - m)))
    real_NxBxC = real_BxM.reshape(b, nk, ck).transpose(1, 0, 2)

  q_NxBxHxCxD = _to_blocks(q_BxLxHxD.astype(jnp.float32) * scale, cq, nq)
  k_NxBxHxCxD = _to_blocks(k_BxMxHxD.astype(jnp.float32), ck, nk)
  v_NxBxHxCxD = _to_blocks(v_BxMxHxD.astype(jnp.float32), ck, nk)
  out_NxBxHxCxD = _attention(
    _Static(bool(causal), cq, ck),
    q_NxBxHxCxD,
    k_NxBxHxCxD,
    v_NxBxHxCxD,
    real_NxBxC,
  )
  out_BxLxHxD = out_NxBxHxCxD.transpose(1, 0, 3, 2, 4)
  out_BxLxHxD = out_BxLxHxD.reshape(b, nq * cq, h, -1)[:, :length]
  return out_BxLxHxD.astype(q_BxLxHxD.dtype)


def _to_blocks(x_BxLxHxD, c, n):
  """[B, L, H, D] -> [N, B, H, C, D], L zero-padded to N * C."""
  b, length, h, d = x_BxLxHxD.shape
  x_BxLxHxD = jnp.pad(x_BxLxHxD, ((0, 0), (0, n * c - length), (0, 0), (0, 0)))
  return x_BxLxHxD.reshape(b, n, c, h, d).transpose(1, 0, 3, 2, 4)


class _Static(NamedTuple):
  """The static part of `_attention`: causal flag and block sizes."""

  causal: bool
  cq: int
  ck: int


def _logits(static, q_BxHxCxD, k_BxHxCxD, real_BxC, i, j, diagonal):
  """float32 s = q k^T [B, H, Cq, Ck] of query block i and key block j,
  -inf where masked (key padding; the causal mask only where `diagonal`)."""
  s_BxHxCxC = jnp.einsum(
    'bhqd,bhkd->bhqk', q_BxHxCxD, k_BxHxCxD, preferred_element_type=jnp.float32
  )
  if real_BxC is not None:
    s_BxHxCxC = jnp.where(real_BxC[:, None, None, :], s_BxHxCxC, -jnp.inf)
  if diagonal:
    rows_C, cols_C = _positions(static, i, j)
    seen_CxC = rows_C[:, None] >= cols_C[None, :]
    s_BxHxCxC = jnp.where(seen_CxC, s_BxHxCxC, -jnp.inf)
  return s_BxHxCxC


def _logits_t(static, q_BxHxCxD, k_BxHxCxD, real_BxC, i, j, diagonal):
  """`_logits` transposed, s^T = k q^T [B, H, Ck, Cq]: the backward pass's
  layout (module doc)."""
  s_BxHxCxC = jnp.einsum(
    'bhkd,bhqd->bhkq', k_BxHxCxD, q_BxHxCxD, preferred_element_type=jnp.float32
  )
  if real_BxC is not None:
    s_BxHxCxC = jnp.where(real_BxC[:, None, :, None], s_BxHxCxC, -jnp.inf)
  if diagonal:
    rows_C, cols_C = _positions(static, i, j)
    seen_CxC = cols_C[:, None] <= rows_C[None, :]
    s_BxHxCxC = jnp.where(seen_CxC, s_BxHxCxC, -jnp.inf)
  return s_BxHxCxC


def _positions(static, i, j):
  """Positions of query block i's rows and key block j's columns."""
  rows_C = i * static.cq + lax.iota(jnp.int32, static.cq)
  cols_C = j * static.ck + lax.iota(jnp.int32, static.ck)
  return rows_C, cols_C


def _key_blocks(static, i, nk):
  """Key blocks query block i sees: [0, full) whole, [full, end) crossed by
  the causal diagonal (full = end = nk without a causal mask)."""
  if not static.causal:
    return nk, nk
  end = jnp.minimum(nk, ((i + 1) * static.cq + static.ck - 1) // static.ck)
  full = jnp.minimum(end, (i * static.cq + 1) // static.ck)
  return full, end


def _query_blocks(static, j, nq):
  """Query blocks that see key block j: [start, full) crossed by the causal
  diagonal, [full, nq) whole (start = full = 0 without a causal mask)."""
  if not static.causal:
    return 0, 0
  start = jnp.minimum(nq, (j * static.ck) // static.cq)
  full = jnp.minimum(nq, ((j + 1) * static.ck - 1 + static.cq - 1) // static.cq)
  return start, jnp.maximum(start, full)


def _forward(static, q_NxBxHxCxD, k_NxBxHxCxD, v_NxBxHxCxD, real_NxBxC):
  """(out [N, B, H, Cq, Dv], lse [N, B, H, Cq]), both float32."""
  nk = k_NxBxHxCxD.shape[0]
  _, b, h, cq, _ = q_NxBxHxCxD.shape
  dim_v = v_NxBxHxCxD.shape[-1]

  def query_block(i, q_BxHxCxD):
    def step(diagonal):
      def body(j, carry):
        m_BxHxC, l_BxHxC, acc_BxHxCxD = carry
        real_BxC = None if real_NxBxC is None else real_NxBxC[j]
        s_BxHxCxC = _logits(
          static, q_BxHxCxD, k_NxBxHxCxD[j], real_BxC, i, j, diagonal
        )
        new_BxHxC = jnp.maximum(m_BxHxC, s_BxHxCxC.max(axis=-1))
        safe_BxHxC = jnp.where(new_BxHxC == -jnp.inf, 0.0, new_BxHxC)
        p_BxHxCxC = jnp.exp(s_BxHxCxC - safe_BxHxC[..., None])
        alpha_BxHxC = jnp.exp(m_BxHxC - safe_BxHxC)
        l_BxHxC = l_BxHxC * alpha_BxHxC + p_BxHxCxC.sum(axis=-1)
        acc_BxHxCxD = acc_BxHxCxD * alpha_BxHxC[..., None] + jnp.einsum(
          'bhqk,bhkd->bhqd', p_BxHxCxC, v_NxBxHxCxD[j]
        )
        return new_BxHxC, l_BxHxC, acc_BxHxCxD

      return body

    carry = (
      jnp.full((b, h, cq), -jnp.inf, jnp.float32),
      jnp.zeros((b, h, cq), jnp.float32),
      jnp.zeros((b, h, cq, dim_v), jnp.float32),
    )
    full, end = _key_blocks(static, i, nk)
    carry = lax.fori_loop(0, full, step(False), carry)
    if static.causal:
      carry = lax.fori_loop(full, end, step(True), carry)
    m_BxHxC, l_BxHxC, acc_BxHxCxD = carry
    seen_BxHxC = l_BxHxC > 0
    out_BxHxCxD = acc_BxHxCxD / jnp.where(seen_BxHxC, l_BxHxC, 1.0)[..., None]
    lse_BxHxC = jnp.where(
      seen_BxHxC, m_BxHxC + jnp.log(jnp.where(seen_BxHxC, l_BxHxC, 1.0)), 0.0
    )
    return i + 1, (out_BxHxCxD, lse_BxHxC)

  _, (out_NxBxHxCxD, lse_NxBxHxC) = lax.scan(query_block, 0, q_NxBxHxCxD)
  return out_NxBxHxCxD, lse_NxBxHxC


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _attention(static, q_NxBxHxCxD, k_NxBxHxCxD, v_NxBxHxCxD, real_NxBxC):
  return _forward(static, q_NxBxHxCxD, k_NxBxHxCxD, v_NxBxHxCxD, real_NxBxC)[0]


def _attention_fwd(static, q_NxBxHxCxD, k_NxBxHxCxD, v_NxBxHxCxD, real_NxBxC):
  out_NxBxHxCxD, lse_NxBxHxC = _forward(
    static, q_NxBxHxCxD, k_NxBxHxCxD, v_NxBxHxCxD, real_NxBxC
  )
  residuals = (
    q_NxBxHxCxD,
    k_NxBxHxCxD,
    v_NxBxHxCxD,
    real_NxBxC,
    out_NxBxHxCxD,
    lse_NxBxHxC,
  )
  return out_NxBxHxCxD, residuals


def _attention_bwd(static, residuals, dout_NxBxHxCxD):
  q_NxBxHxCxD, k_NxBxHxCxD, v_NxBxHxCxD, real_NxBxC = residuals[:4]
  out_NxBxHxCxD, lse_NxBxHxC = residuals[4:]
  nq = q_NxBxHxCxD.shape[0]
  dout_NxBxHxCxD = dout_NxBxHxCxD.astype(jnp.float32)
  delta_NxBxHxC = jnp.sum(dout_NxBxHxCxD * out_NxBxHxCxD, axis=-1)

  def key_block(dqt_NxBxHxDxC, xs):
    j, k_BxHxCxD, kt_BxHxDxC, v_BxHxCxD = xs[:4]
    real_BxC = xs[4] if real_NxBxC is not None else None

    def step(diagonal):
      def body(i, carry):
        dqt_NxBxHxDxC, dk_BxHxCxD, dv_BxHxCxD = carry
        q_BxHxCxD = q_NxBxHxCxD[i]
        do_BxHxCxD = dout_NxBxHxCxD[i]
        st_BxHxCxC = _logits_t(
          static, q_BxHxCxD, k_BxHxCxD, real_BxC, i, j, diagonal
        )
        pt_BxHxCxC = jnp.exp(st_BxHxCxC - lse_NxBxHxC[i][..., None, :])
        dv_BxHxCxD = dv_BxHxCxD + jnp.einsum(
          'bhkq,bhqd->bhkd', pt_BxHxCxC, do_BxHxCxD
        )
        dpt_BxHxCxC = jnp.einsum('bhkd,bhqd->bhkq', v_BxHxCxD, do_BxHxCxD)
        dst_BxHxCxC = pt_BxHxCxC * (
          dpt_BxHxCxC - delta_NxBxHxC[i][..., None, :]
        )
        dqt_NxBxHxDxC = dqt_NxBxHxDxC.at[i].add(
          jnp.einsum('bhdk,bhkq->bhdq', kt_BxHxDxC, dst_BxHxCxC)
        )
        dk_BxHxCxD = dk_BxHxCxD + jnp.einsum(
          'bhkq,bhqd->bhkd', dst_BxHxCxC, q_BxHxCxD
        )
        return dqt_NxBxHxDxC, dk_BxHxCxD, dv_BxHxCxD

      return body

    carry = (
      dqt_NxBxHxDxC,
      jnp.zeros_like(k_BxHxCxD),
      jnp.zeros_like(v_BxHxCxD),
    )
    start, full = _query_blocks(static, j, nq)
    if static.causal:
      carry = lax.fori_loop(start, full, step(True), carry)
    carry = lax.fori_loop(full, nq, step(False), carry)
    dqt_NxBxHxDxC, dk_BxHxCxD, dv_BxHxCxD = carry
    return dqt_NxBxHxDxC, (dk_BxHxCxD, dv_BxHxCxD)

  nk = k_NxBxHxCxD.shape[0]
  # dQ accumulates transposed, dQ^T = K^T dS^T (module doc).
  kt_NxBxHxDxC = jnp.swapaxes(k_NxBxHxCxD, -1, -2)
  xs = (jnp.arange(nk), k_NxBxHxCxD, kt_NxBxHxDxC, v_NxBxHxCxD)
  if real_NxBxC is not None:
    xs = xs + (real_NxBxC,)
  dqt_NxBxHxDxC, (dk_NxBxHxCxD, dv_NxBxHxCxD) = lax.scan(
    key_block, jnp.swapaxes(jnp.zeros_like(q_NxBxHxCxD), -1, -2), xs
  )
  dq_NxBxHxCxD = jnp.swapaxes(dqt_NxBxHxDxC, -1, -2)
  return dq_NxBxHxCxD, dk_NxBxHxCxD, dv_NxBxHxCxD, None


_attention.defvjp(_attention_fwd, _attention_bwd)
