"""Kernelised attention given feature maps: the routine shared by
linear_transformer and performer.

  out_i = phi(q_i) . S / (phi(q_i) . z)
  S = sum_j phi(k_j) v_j^T,  z = sum_j phi(k_j)

over the visible keys j (padded keys' features are zeroed; causal: j <= i).
Non-causal: S [B, H, F, D] and z [B, H, F] are built once; time O(L F D),
memory O(L F + F D) per head. Causal: prefix sums chunk by chunk with
`jax.lax.scan` over chunks of C positions: inside a chunk a C x C masked
quadratic form, across chunks a carried [B, H, F, D] state. The scan body is
rematerialised, so the backward pass keeps one state per chunk (L / C of
them), never one per position: memory O(L F D / C + L C) per head, time
O(L F D + L C F).

Sums and the normaliser are float32 whatever the input dtype. A query with
no visible key (normaliser 0) gets zeros, not NaN.
"""

import jax
import jax.numpy as jnp

from models.attention.base import pad_to_multiple

# Causal chunk length C (positions per scan step).
CHUNK = 64
# A normaliser below this counts as "no visible key": the output is zero
# (keeps out = num / den and its gradient -out / den finite).
TINY = 1e-30


def kernel_attention(
  phi_q_BxLxHxF, phi_k_BxMxHxF, v_BxMxHxD, valid_BxM, *, causal, chunk=CHUNK
):
  """Linear attention with non-negative feature maps; out float32 [B,L,H,D].

  Args:
    phi_q_BxLxHxF: query features (non-negative).
    phi_k_BxMxHxF: key features (non-negative); entries of padded keys are
      ignored (replaced by zeros here, so they may be anything finite).
    v_BxMxHxD: values.
    valid_BxM: bool, True for real keys.
    causal: query i sees keys j <= i only.
    chunk: positions per scan step in the causal case.
  """
  keep_BxMx1x1 = valid_BxM[:, :, None, None]
  phi_k_BxMxHxF = jnp.where(keep_BxMx1x1, phi_k_BxMxHxF.astype(jnp.float32), 0)
  v_BxMxHxD = jnp.where(keep_BxMx1x1, v_BxMxHxD.astype(jnp.float32), 0)
  phi_q_BxLxHxF = phi_q_BxLxHxF.astype(jnp.float32)
  if causal:
    num_BxLxHxD, den_BxLxH = _causal_sums(
      phi_q_BxLxHxF, phi_k_BxMxHxF, v_BxMxHxD, chunk
    )
  else:
    s_BxHxFxD = jnp.einsum('bmhf,bmhd->bhfd', phi_k_BxMxHxF, v_BxMxHxD)
    z_BxHxF = jnp.sum(phi_k_BxMxHxF, axis=1)
    num_BxLxHxD = jnp.einsum('blhf,bhfd->blhd', phi_q_BxLxHxF, s_BxHxFxD)
    den_BxLxH = jnp.einsum('blhf,bhf->blh', phi_q_BxLxHxF, z_BxHxF)
  return normalise(num_BxLxHxD, den_BxLxH)


def normalise(num_BxLxHxD, den_BxLxH):
  """num / den, zeros where den is (numerically) zero."""
  ok_BxLxH = den_BxLxH > TINY
  safe_BxLxH = jnp.where(ok_BxLxH, den_BxLxH, 1.0)
  return jnp.where(
    ok_BxLxH[..., None], num_BxLxHxD / safe_BxLxH[..., None], 0.0
  )


def _causal_sums(phi_q_BxLxHxF, phi_k_BxMxHxF, v_BxMxHxD, chunk):
  """Causal numerator [B, L, H, D] and normaliser [B, L, H] by chunks."""
  b, length, h, f = phi_q_BxLxHxF.shape
  d = v_BxMxHxD.shape[-1]
  m = phi_k_BxMxHxF.shape[1]
  # Keys after the last query are never visible; missing keys are invisible.
  if m > length:
    phi_k_BxMxHxF = phi_k_BxMxHxF[:, :length]
    v_BxMxHxD = v_BxMxHxD[:, :length]
  elif m < length:
    phi_k_BxMxHxF = pad_to_multiple(phi_k_BxMxHxF, length, axis=1)
    v_BxMxHxD = pad_to_multiple(v_BxMxHxD, length, axis=1)
  c = min(chunk, length)
  n = -(-length // c)

  def chunks(t):  # [B, n*C, H, X] -> [n, B, C, H, X]; pads with zeros.
    t = pad_to_multiple(t, c, axis=1)
    return jnp.moveaxis(t.reshape(b, n, c, h, t.shape[-1]), 1, 0)

  tril_CxC = jnp.tril(jnp.ones((c, c), bool))

  @jax.checkpoint
  def step(carry, xs):
    s_BxHxFxD, z_BxHxF = carry
    pq_BxCxHxF, pk_BxCxHxF, v_BxCxHxD = xs
    a_BxHxCxC = jnp.einsum('bchf,bkhf->bhck', pq_BxCxHxF, pk_BxCxHxF)
    a_BxHxCxC = jnp.where(tril_CxC, a_BxHxCxC, 0.0)
    num_BxCxHxD = jnp.einsum(
      'bchf,bhfd->bchd', pq_BxCxHxF, s_BxHxFxD
    ) + jnp.einsum('bhck,bkhd->bchd', a_BxHxCxC, v_BxCxHxD)
    den_BxCxH = jnp.einsum('bchf,bhf->bch', pq_BxCxHxF, z_BxHxF) + jnp.sum(
      a_BxHxCxC, axis=-1
    ).transpose(0, 2, 1)
    s_BxHxFxD = s_BxHxFxD + jnp.einsum('bkhf,bkhd->bhfd', pk_BxCxHxF, v_BxCxHxD)
    z_BxHxF = z_BxHxF + jnp.sum(pk_BxCxHxF, axis=1)
    return (s_BxHxFxD, z_BxHxF), (num_BxCxHxD, den_BxCxH)

  init = (
    jnp.zeros((b, h, f, d), jnp.float32),
    jnp.zeros((b, h, f), jnp.float32),
  )
  xs = (chunks(phi_q_BxLxHxF), chunks(phi_k_BxMxHxF), chunks(v_BxMxHxD))
  _, (num_NxBxCxHxD, den_NxBxCxH) = jax.lax.scan(step, init, xs)
  num_BxLxHxD = jnp.moveaxis(num_NxBxCxHxD, 0, 1).reshape(b, n * c, h, d)
  den_BxLxH = jnp.moveaxis(den_NxBxCxH, 0, 1).reshape(b, n * c, h)
  return num_BxLxHxD[:, :length], den_BxLxH[:, :length]
