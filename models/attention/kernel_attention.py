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

Layout: heads first. `kernel_attention_heads_first` takes [B, H, L, F]
features, so every product is a plain batched matmul over (B, H) for XLA's
CPU backend; with [B, L, H, F] operands the key summary S = phi(K)^T V and
its gradients got transposed layouts outside the fast matmul path (issue
#35: performer and linear_transformer build their features heads first).
`kernel_attention` is the [B, L, H, F] entry point (it transposes).
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
  out_BxHxLxD = kernel_attention_heads_first(
    swap_heads(phi_q_BxLxHxF),
    swap_heads(phi_k_BxMxHxF),
    swap_heads(v_BxMxHxD),
    valid_BxM,
    causal=causal,
    chunk=chunk,
  )
  return swap_heads(out_BxHxLxD)


def swap_heads(x):
  """[B, L, H, X] <-> [B, H, L, X] (a copy)."""
  return jnp.swapaxes(x, 1, 2)


def kernel_attention_heads_first(
  phi_q_BxHxLxF, phi_k_BxHxMxF, v_BxHxMxD, valid_BxM, *, causal, chunk=CHUNK
):
  """`kernel_attention` on heads-first operands; out float32 [B, H, L, D]."""
  keep_Bx1xMx1 = valid_BxM[:, None, :, None]
  phi_k_BxHxMxF = jnp.where(keep_Bx1xMx1, phi_k_BxHxMxF.astype(jnp.float32), 0)
  v_BxHxMxD = jnp.where(keep_Bx1xMx1, v_BxHxMxD.astype(jnp.float32), 0)
  phi_q_BxHxLxF = phi_q_BxHxLxF.astype(jnp.float32)
  if causal:
    num_BxHxLxD, den_BxHxL = _causal_sums(
      phi_q_BxHxLxF, phi_k_BxHxMxF, v_BxHxMxD, chunk
    )
  else:
    s_BxHxFxD = jnp.einsum('bhmf,bhmd->bhfd', phi_k_BxHxMxF, v_BxHxMxD)
    z_BxHxF = jnp.sum(phi_k_BxHxMxF, axis=2)
    num_BxHxLxD = jnp.einsum('bhlf,bhfd->bhld', phi_q_BxHxLxF, s_BxHxFxD)
    den_BxHxL = jnp.einsum('bhlf,bhf->bhl', phi_q_BxHxLxF, z_BxHxF)
  return normalise(num_BxHxLxD, den_BxHxL)


def normalise(num_XxD, den_X):
  """num / den, zeros where den is (numerically) zero; any leading dims X."""
  ok_X = den_X > TINY
  safe_X = jnp.where(ok_X, den_X, 1.0)
  return jnp.where(ok_X[..., None], num_XxD / safe_X[..., None], 0.0)


def _causal_sums(phi_q_BxHxLxF, phi_k_BxHxMxF, v_BxHxMxD, chunk):
  """Causal numerator [B, H, L, D] and normaliser [B, H, L] by chunks."""
  b, h, length, f = phi_q_BxHxLxF.shape
  d = v_BxHxMxD.shape[-1]
  m = phi_k_BxHxMxF.shape[2]
  # Keys after the last query are never visible; missing keys are invisible.
  if m > length:
    phi_k_BxHxMxF = phi_k_BxHxMxF[:, :, :length]
    v_BxHxMxD = v_BxHxMxD[:, :, :length]
  elif m < length:
    phi_k_BxHxMxF = pad_to_multiple(phi_k_BxHxMxF, length, axis=2)
    v_BxHxMxD = pad_to_multiple(v_BxHxMxD, length, axis=2)
  c = min(chunk, length)
  n = -(-length // c)

  def chunks(t):  # [B, H, n*C, X] -> [n, B, H, C, X]; pads with zeros.
    t = pad_to_multiple(t, c, axis=2)
    return jnp.moveaxis(t.reshape(b, h, n, c, t.shape[-1]), 2, 0)

  tril_CxC = jnp.tril(jnp.ones((c, c), bool))

  @jax.checkpoint
  def step(carry, xs):
    s_BxHxFxD, z_BxHxF = carry
    pq_BxHxCxF, pk_BxHxCxF, v_BxHxCxD = xs
    a_BxHxCxC = jnp.einsum('bhcf,bhkf->bhck', pq_BxHxCxF, pk_BxHxCxF)
    a_BxHxCxC = jnp.where(tril_CxC, a_BxHxCxC, 0.0)
    num_BxHxCxD = jnp.einsum(
      'bhcf,bhfd->bhcd', pq_BxHxCxF, s_BxHxFxD
    ) + jnp.einsum('bhck,bhkd->bhcd', a_BxHxCxC, v_BxHxCxD)
    den_BxHxC = jnp.einsum('bhcf,bhf->bhc', pq_BxHxCxF, z_BxHxF) + jnp.sum(
      a_BxHxCxC, axis=-1
    )
    s_BxHxFxD = s_BxHxFxD + jnp.einsum('bhkf,bhkd->bhfd', pk_BxHxCxF, v_BxHxCxD)
    z_BxHxF = z_BxHxF + jnp.sum(pk_BxHxCxF, axis=2)
    return (s_BxHxFxD, z_BxHxF), (num_BxHxCxD, den_BxHxC)

  init = (
    jnp.zeros((b, h, f, d), jnp.float32),
    jnp.zeros((b, h, f), jnp.float32),
  )
  xs = (chunks(phi_q_BxHxLxF), chunks(phi_k_BxHxMxF), chunks(v_BxHxMxD))
  _, (num_NxBxHxCxD, den_NxBxHxC) = jax.lax.scan(step, init, xs)
  num_BxHxLxD = jnp.moveaxis(num_NxBxHxCxD, 0, 2).reshape(b, h, n * c, d)
  den_BxHxL = jnp.moveaxis(den_NxBxHxC, 0, 2).reshape(b, h, n * c)
  return num_BxHxLxD[:, :, :length], den_BxHxL[:, :, :length]
