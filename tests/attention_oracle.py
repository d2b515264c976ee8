"""Test-only helpers shared by the attention tests: inputs, a dense oracle.

The oracle is softmax attention written out in float64 numpy with an explicit
boolean pattern [B|1, H|1, L, M]: the only place a dense mask is built.
"""

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from models.attention import Mask, build  # noqa: F401 (re-exported)


def make(
  options,
  *,
  num_heads=2,
  head_dim=8,
  max_length=64,
  dropout_rate=0.0,
  seed=0,
  layer_index=0,
  dtype=jnp.float32,
):
  """Builds a core from a `model.attention` block ({'name': ..., opts})."""
  return build(
    dict(options),
    num_heads=num_heads,
    head_dim=head_dim,
    max_length=max_length,
    dropout_rate=dropout_rate,
    dtype=dtype,
    rngs=nnx.Rngs(seed),
    layer_index=layer_index,
  )


def qkv(seed=0, batch=2, length=37, heads=2, dim=8, scale=1.0):
  """Three normal [B, L, H, D] arrays from one seed."""
  ks = jax.random.split(jax.random.key(seed), 3)
  return [scale * jax.random.normal(k, (batch, length, heads, dim)) for k in ks]


def padding(lengths, length):
  """bool[B, L]: True for the first lengths[b] positions."""
  return jnp.arange(length)[None, :] < jnp.asarray(lengths)[:, None]


def allowed_mask(pattern, pad=None, causal=False):
  """bool[B|1, H|1, L, M] = pattern & key padding & causal (numpy).

  pattern: bool [L, M], [H, L, M] or [B, H, L, M].
  """
  a = np.asarray(pattern, bool)
  while a.ndim < 4:
    a = a[None]
  if pad is not None:
    a = a & np.asarray(pad, bool)[:, None, None, :]
  if causal:
    length, m = a.shape[-2:]
    a = a & np.tril(np.ones((length, m), bool))
  return a


def dense_reference(q, k, v, allowed, scale=None):
  """softmax(q k^T * scale | allowed) v in float64; rows with no key -> 0."""
  q, k, v = (np.asarray(t, np.float64) for t in (q, k, v))
  b, length, h, d = q.shape
  scale = d**-0.5 if scale is None else scale
  allowed = np.broadcast_to(allowed, (b, h, length, k.shape[1]))
  s = np.einsum('blhd,bmhd->bhlm', q, k) * scale
  s = np.where(allowed, s, -np.inf)
  top = np.max(s, axis=-1, keepdims=True)
  w = np.where(allowed, np.exp(s - np.where(np.isfinite(top), top, 0)), 0)
  norm = w.sum(-1, keepdims=True)
  w = w / np.where(norm > 0, norm, 1)
  return np.einsum('bhlm,bmhd->blhd', w, v)


def full_pattern(length, m=None):
  return np.ones((length, length if m is None else m), bool)


def run(core, q, k, v, pad=None, causal=False, rngs=None):
  """core(...)[0] as float64 numpy, jitted (op-by-op dispatch is the slow
  part on CPU). Traced afresh each call: parameters set by a test count."""
  f = jax.jit(
    lambda q, k, v, pad, key: core(q, k, v, Mask(pad, causal), rngs=key)[0]
  )
  return np.asarray(f(q, k, v, pad, rngs), np.float64)


def depends_on_future(core, q, k, v, t, pad=None):
  """Whether output at t has a nonzero gradient wrt any input after t."""

  def f(q, k, v):
    return core(q, k, v, Mask(pad, True))[0][:, t].sum()

  grads = jax.jit(jax.grad(f, argnums=(0, 1, 2)))(q, k, v)
  return any(np.abs(np.asarray(g)[:, t + 1 :]).sum() > 0 for g in grads)


def time_gradients(core, q, k, v, ts, pad=None, causal=True):
  """|d out[:, t] / d (q, k, v)| summed per input position: float [T, 3, L].

  One compiled program for every t (a vmap over the output's cotangents),
  for causality checks: row t must be zero after t.
  """

  @jax.jit
  def f(q, k, v):
    out, pull = jax.vjp(
      lambda q, k, v: core(q, k, v, Mask(pad, causal))[0], q, k, v
    )
    onehot_TxL = jax.nn.one_hot(jnp.asarray(ts), out.shape[1], dtype=out.dtype)
    cts = onehot_TxL[:, None, :, None, None] * jnp.ones_like(out)[None]
    grads = jax.vmap(pull)(cts)
    return jnp.stack([jnp.abs(g).sum(axis=(1, 3, 4)) for g in grads], axis=1)

  return np.asarray(f(q, k, v))
