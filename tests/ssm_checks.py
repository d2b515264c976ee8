"""Test-only helpers for the state-space mixers (s4d, s5): inputs, a jitted
call, the float64 recurrence driver and output head, and the property checks
both files share.
"""

import functools
import math

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from models.attention import Mask


def make(cls, *, emb_dim=4, dropout_rate=0.0, seed=0, dtype=jnp.float32, **kw):
  """A mixer built with the builder's keyword arguments plus its options."""
  return cls(
    emb_dim=emb_dim,
    num_heads=2,
    max_length=128,
    dropout_rate=dropout_rate,
    dtype=dtype,
    rngs=nnx.Rngs(seed),
    layer_index=0,
    **kw,
  )


def inputs(seed, batch, length, emb_dim, scale=1.0):
  return scale * jax.random.normal(
    jax.random.key(seed), (batch, length, emb_dim)
  )


def padding(lengths, length):
  """bool[B, L]: True for the first lengths[b] positions."""
  return jnp.arange(length)[None, :] < jnp.asarray(lengths)[:, None]


@functools.partial(jax.jit, static_argnums=(0, 4))
def _apply(graphdef, state, x, pad, causal, key):
  return nnx.merge(graphdef, state)(x, Mask(pad, causal), rngs=key)[0]


def run(mixer, x, pad=None, causal=False, key=None):
  """mixer(...)[0] as float64 numpy, under jax.jit (one compilation per
  structure and shape: the parameters are an argument)."""
  graphdef, state = nnx.split(mixer)
  out = _apply(graphdef, state, x, pad, causal, key)
  return np.asarray(out.astype(jnp.float32), np.float64)


def p64(param):
  """An nnx parameter as float64 numpy."""
  return np.asarray(param[...], np.float64)


def recurrence64(u, lengths, causal, d, x0, step):
  """y_t = sum over passes of step's readout + D u_t, in float64 over each
  example's real tokens (zero at padding): pass 0 runs forward from x0,
  pass 1 (bidirectional) backward from the last real token.
  step(x, u_t, g) -> (x, y_t) advances pass g's state by one token."""
  u = np.asarray(u, np.float64)
  y = np.zeros_like(u)
  passes = [(0, False)] + ([(1, True)] if not causal else [])
  for i, n in enumerate(lengths):
    for g, backward in passes:
      x = x0
      for t in reversed(range(n)) if backward else range(n):
        x, y_t = step(x, u[i, t], g)
        y[i, t] += y_t
    y[i, :n] += d * u[i, :n]
  return y


def head64(mixer, y_BxLxE, lengths):
  """The output head in float64 after the SSM output y (zero at padding):
  GELU (exact, or its tanh form when mixer.gelu_approximate: the S5
  authors' flax nn.gelu), then (glu) Linear E -> 2E and a * sigmoid(b),
  times the mask."""
  y = y_BxLxE
  if mixer.gelu_approximate:
    c = math.sqrt(2.0 / math.pi)
    h = 0.5 * y * (1.0 + np.tanh(c * (y + 0.044715 * y**3)))
  else:
    erf = np.vectorize(math.erf)
    h = 0.5 * y * (1.0 + erf(y / math.sqrt(2.0)))
  if mixer.out is not None:  # s4d always, s5 with glu
    h = h @ p64(mixer.out.kernel) + p64(mixer.out.bias)
  if mixer.activation == 'glu':
    a, gate = np.split(h, 2, axis=-1)
    h = a / (1.0 + np.exp(-gate))
  length = y_BxLxE.shape[1]
  real = np.arange(length)[None, :] < np.asarray(lengths)[:, None]
  return h * real[:, :, None]


def check_padding_invariance(mixer, length, emb_dim, causal):
  """Padded content reaches no real output; the real outputs equal those of
  the unpadded example (left-packed); an all-padded example gives zeros."""
  x = inputs(3, 3, length, emb_dim)
  pad = padding([length, 20, 0], length)
  noise = inputs(4, 3, length, emb_dim, scale=10.0)
  x_noisy = jnp.where(pad[:, :, None], x, noise)
  out = run(mixer, x, pad, causal)
  out_noisy = run(mixer, x_noisy, pad, causal)
  np.testing.assert_array_equal(out, out_noisy)
  alone = run(mixer, x[1:2, :20], None, causal)
  np.testing.assert_allclose(out[1, :20], alone[0], atol=2e-5, rtol=1e-5)
  assert np.all(out[1, 20:] == 0)
  assert np.all(out[2] == 0)
  assert np.abs(out[0]).max() > 0.1  # a real example is not zero


def check_finite_gradients(mixer, length, emb_dim, causal):
  """Gradients wrt every parameter and the input are finite, with an
  all-padded example in the batch, and not all zero."""
  x = inputs(5, 2, length, emb_dim)
  pad = padding([length - 3, 0], length)

  graphdef, params = nnx.split(mixer)

  @jax.jit
  def grads(params, x):
    def loss(params, x):
      y = nnx.merge(graphdef, params)(x, Mask(pad, causal))[0]
      return jnp.sum(y.astype(jnp.float32) ** 2)

    return jax.grad(loss, argnums=(0, 1))(params, x)

  g_params, g_x = grads(params, x)
  leaves = jax.tree.leaves(g_params) + [g_x]
  assert all(np.isfinite(np.asarray(v)).all() for v in leaves)
  nonzero = [float(np.abs(np.asarray(v)).max()) > 0 for v in leaves]
  assert all(nonzero), nonzero
  assert np.abs(np.asarray(g_x)[1]).max() == 0  # padding gets no gradient


def time_jacobian(mixer, length, emb_dim, causal):
  """|d y_t / d x_s| summed over channels: float [L, L] (one example)."""
  x = inputs(6, 1, length, emb_dim)
  jac = jax.jit(jax.jacrev(lambda x: mixer(x, Mask(None, causal))[0][0]))(
    x
  )  # [L, E, 1, L, E]
  return np.abs(np.asarray(jac)).sum(axis=(1, 2, 4))


def check_causality(mixer, length, emb_dim, exact):
  """The causal mixer never looks ahead (exactly when `exact`, else up to
  float32 rounding) and sees every earlier token; the bidirectional one
  sees ahead."""
  jac_causal = time_jacobian(mixer, length, emb_dim, causal=True)
  jac_both = time_jacobian(mixer, length, emb_dim, causal=False)
  future = np.triu(np.ones((length, length), bool), 1)  # s > t
  scale = jac_causal.max()
  if exact:
    assert np.all(jac_causal[future] == 0)
  else:
    assert jac_causal[future].max() < 1e-6 * scale
  assert jac_causal[~future].min() > 1e-4 * scale  # the past is seen
  assert jac_both[future].min() > 1e-4 * scale  # bidirectional sees ahead


def check_dropout_uses_the_key(cls, emb_dim, **kw):
  """Dropout 0.5: an output with a key differs from the deterministic one
  and from one with another key."""
  m = make(cls, emb_dim=emb_dim, dropout_rate=0.5, **kw)
  x = inputs(2, 2, 16, emb_dim)
  det = run(m, x)
  drop_a = run(m, x, key=jax.random.key(0))
  drop_b = run(m, x, key=jax.random.key(1))
  assert not np.allclose(drop_a, det) and not np.allclose(drop_a, drop_b)


def check_bf16_close(cls, length, emb_dim, causal, atol, **kw):
  """dtype=bfloat16 under jit (bfloat16 input) runs, its output is
  bfloat16 and close to the float32 mixer's (same parameters)."""
  m32 = make(cls, emb_dim=emb_dim, **kw)
  m16 = make(cls, emb_dim=emb_dim, dtype=jnp.bfloat16, **kw)
  x = inputs(7, 2, length, emb_dim)
  pad = padding([length, 20], length)
  f = jax.jit(lambda x: m16(x, Mask(pad, causal))[0])
  y16 = f(x.astype(jnp.bfloat16))
  assert y16.dtype == jnp.bfloat16
  y16 = np.asarray(y16.astype(jnp.float32), np.float64)
  y32 = run(m32, x, pad, causal)
  assert np.isfinite(y16).all()
  np.testing.assert_allclose(y16, y32, atol=atol * np.abs(y32).max())
  assert np.all(y16[1, 20:] == 0)
