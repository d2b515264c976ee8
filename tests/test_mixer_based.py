"""based: the Taylor linear attention = a float64 step loop over its state
sum phi(k) v^T and normaliser sum phi(k); the sliding window = dense masked
softmax in float64; the per-layer mix; padding; causality; init; options."""

import functools

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models.attention import Mask
from models.attention.registry import get_core_class
from models.errors import UserError
from models.mixers.based import Based, expanded_size, taylor_features

B, E, H = 2, 8, 2
# Read by tests/test_mixer_suite.py: small, fast options for its runs (both
# parts in the one layer the suite builds).
SUITE = dict(opts={'feature_dim': 4, 'window': 8, 'mix': 'sum'})
# Chunks of 8 (37: a partial last chunk; 5: shorter than one), a window of 8.
OPTS = dict(feature_dim=4, window=8, chunk_size=8)


def make(seed=0, layer_index=0, **opts):
  return Based(
    emb_dim=E,
    num_heads=H,
    max_length=128,
    dropout_rate=0.0,
    dtype=jnp.float32,
    rngs=nnx.Rngs(seed),
    layer_index=layer_index,
    **{**OPTS, **opts},
  )


@functools.cache
def mixer(mix):
  """The shared mixers (one compiled program per shape and mask kind)."""
  return make(mix=mix)


@functools.partial(jax.jit, static_argnums=(0, 4))
def _apply(graphdef, state, x, pad, causal):
  return nnx.merge(graphdef, state)(x, Mask(pad, causal))[0]


def run(m, x, pad, causal):
  return np.asarray(_apply(*nnx.split(m), x, pad, causal), np.float64)


def normal(seed, *shape):
  return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def padding(lengths, length):
  return np.arange(length)[None, :] < np.asarray(lengths)[:, None]


def f64(t):
  """An array or an nnx parameter as float64 numpy."""
  return np.asarray(t[...] if isinstance(t, nnx.Variable) else t, np.float64)


def phi(u):
  """The paper's map: [1, u', (u' outer u') / sqrt(2)], u' = u / F^(1/4),
  the outer product in full (F^2 entries), float64."""
  f = u.shape[-1]
  u = u / f**0.25
  outer = (u[..., :, None] * u[..., None, :]).reshape(u.shape[:-1] + (f * f,))
  return np.concatenate([np.ones(u.shape[:-1] + (1,)), u, outer / 2**0.5], -1)


def linear_loop(p, x, real, causal):
  """The linear attention step by step in float64: S += phi(k) v^T and
  z += phi(k) at each real token, y = phi(q) S / phi(q) . z."""
  b, length, _ = x.shape
  f = p.feature_dim
  q = phi((x @ f64(p.proj_q.kernel)).reshape(b, length, H, f))
  k = phi((x @ f64(p.proj_k.kernel)).reshape(b, length, H, f))
  v = (x @ f64(p.proj_v.kernel)).reshape(b, length, H, E // H)
  y = np.zeros((b, length, H, E // H))
  for i in range(b):
    s = np.zeros((H, q.shape[-1], E // H))
    z = np.zeros((H, q.shape[-1]))
    for t in range(length) if causal else ():
      if real[i, t]:
        s = s + k[i, t][..., None] * v[i, t][:, None, :]
        z = z + k[i, t]
      num = np.einsum('hg,hgd->hd', q[i, t], s)
      den = np.einsum('hg,hg->h', q[i, t], z)
      y[i, t] = num / den[:, None] if real[i, t] else 0.0
    if not causal:
      s = np.einsum('lhg,lhd,l->hgd', k[i], v[i], real[i])
      z = np.einsum('lhg,l->hg', k[i], real[i])
      num = np.einsum('lhg,hgd->lhd', q[i], s)
      y[i] = num / np.einsum('lhg,hg->lh', q[i], z)[..., None]
  return y.reshape(b, length, E) @ f64(p.out_proj.kernel)


def window_dense(p, x, real, causal, window):
  """The sliding window as dense masked softmax attention, float64."""
  b, length, _ = x.shape
  qkv = x @ f64(p.qkv.kernel) + f64(p.qkv.bias)
  q, k, v = (t.reshape(b, length, H, E // H) for t in np.split(qkv, 3, -1))
  logits = np.einsum('bthd,bjhd->bhtj', q, k) / np.sqrt(E // H)
  back = np.arange(length)[:, None] - np.arange(length)[None, :]  # t - j
  near = (back >= 0) & (back < window) if causal else np.abs(back) < window
  allowed = near[None, None] & (real[:, None, None, :] > 0)
  logits = np.where(allowed, logits, -np.inf)
  top = logits.max(-1, keepdims=True)
  w = np.exp(logits - np.where(np.isfinite(top), top, 0.0))
  w = w / np.maximum(w.sum(-1, keepdims=True), 1e-300)  # none seen: zeros
  y = np.einsum('bhtj,bjhd->bthd', w, v).reshape(b, length, E)
  return y @ f64(p.out_proj.kernel) + f64(p.out_proj.bias)


def reference(m, x, pad, causal):
  """The whole mixer in float64 numpy from the module's own parameters."""
  b, length, _ = x.shape
  real = np.ones((b, length)) if pad is None else f64(pad)
  x = f64(x) * real[..., None]
  y = np.zeros((b, length, E))
  if m.linear is not None:
    y = y + linear_loop(m.linear, x, real, causal)
  if m.sliding is not None:
    y = y + window_dense(m.sliding, x, real, causal, m.sliding.window)
  return y * real[..., None]


def test_taylor_features():
  """Compact features: 1 + F + F (F + 1) / 2 of them, inner products those
  of the paper's full map, 1 + s + s^2 / 2 with s = q . k / sqrt(F)."""
  f = 5
  q, k = normal(1, 3, f), normal(2, 3, f)
  pq, pk = map(f64, jax.jit(taylor_features)(np.stack([q, k])))
  assert pq.shape == (3, expanded_size(f)) == (3, 1 + 5 + 15)
  s = np.sum(f64(q) * f64(k), -1) / np.sqrt(f)
  np.testing.assert_allclose(np.sum(pq * pk, -1), 1 + s + s**2 / 2, rtol=1e-5)
  full = np.sum(phi(f64(q)) * phi(f64(k)), -1)
  np.testing.assert_allclose(np.sum(pq * pk, -1), full, rtol=1e-5)


@pytest.mark.parametrize('causal', [True, False])
@pytest.mark.parametrize('length', [37, 5])
def test_linear_part_equals_step_loop(length, causal):
  m = mixer('linear')
  assert m.sliding is None
  x = normal(3, B, length, E)
  pad = padding([length, max(1, length - 12)], length)
  got = run(m, x, pad, causal)
  ref = reference(m, x, pad, causal)
  scale = np.abs(ref).max()
  assert scale > 1e-4
  np.testing.assert_allclose(got, ref, atol=1e-5 * scale)


@pytest.mark.parametrize('causal', [True, False])
@pytest.mark.parametrize('length', [37, 5])
def test_window_part_equals_dense_softmax(length, causal):
  """Window 8: blocks of 8 at length 37 (a partial last one), one block
  of 5 shorter than the window."""
  m = mixer('sliding')
  assert m.linear is None
  x = normal(4, B, length, E)
  pad = padding([length, max(1, length - 12)], length)
  got = run(m, x, pad, causal)
  ref = reference(m, x, pad, causal)
  scale = np.abs(ref).max()
  assert scale > 1e-4
  np.testing.assert_allclose(got, ref, atol=1e-5 * scale)


def test_the_mix():
  """'alternate': layer 0 linear, layer 1 window, layer 2 linear; 'sum':
  both, their outputs added; state sizes."""
  layers = [make(mix='alternate', layer_index=i) for i in range(3)]
  assert [m.linear is not None for m in layers] == [True, False, True]
  assert [m.sliding is not None for m in layers] == [False, True, False]
  assert make().mix == 'alternate'  # the default
  g = expanded_size(4)
  assert layers[0].state_size() == H * (E // H + 1) * g
  assert layers[1].state_size() == 2 * (8 - 1) * E
  m = mixer('sum')
  assert m.state_size() == H * (E // H + 1) * g + 2 * 7 * E
  length = 37
  x = normal(5, B, length, E)
  pad = padding([length, 21], length)
  got = run(m, x, pad, True)
  ref = reference(m, x, pad, True)
  np.testing.assert_allclose(got, ref, atol=1e-5 * np.abs(ref).max())


@pytest.mark.parametrize('causal', [True, False])
def test_padding_is_invisible(causal):
  length, short = 37, 21
  m = mixer('sum')
  x = normal(6, B, length, E)
  pad = padding([length, short], length)
  out = run(m, x, pad, causal)
  noise = 30 * normal(7, B, length, E)
  out2 = run(m, np.where(pad[..., None], x, noise), pad, causal)
  np.testing.assert_allclose(out2, out, atol=1e-7)
  np.testing.assert_array_equal(out[1, short:], 0.0)
  alone = reference(m, x[1:, :short], None, causal)
  np.testing.assert_allclose(
    out[1, :short], alone[0], atol=1e-5 * np.abs(alone).max()
  )
  # No real token: zeros, and finite gradients.
  empty = padding([length, 0], length)
  np.testing.assert_array_equal(run(m, x, empty, causal)[1], 0.0)
  graphdef, state = nnx.split(m)

  @jax.jit
  @jax.grad
  def grad_fn(x):
    return jnp.sum(_apply(graphdef, state, x, empty, causal) ** 2)

  grad = np.asarray(grad_fn(x))
  assert np.isfinite(grad).all()
  np.testing.assert_array_equal(grad[1], 0.0)
  assert np.abs(grad[0]).sum() > 0


def test_causal_by_perturbation():
  """Causal: changing token s moves no output before s (bit for bit) and
  every output after it that sees it: all of them through the linear
  attention ('sum'), those of t - 8 < s <= t through the window alone."""
  length = 37
  x = normal(8, B, length, E)
  pad = padding([length, 30], length)
  t = np.arange(length)
  for mix in ('sum', 'sliding'):
    m = mixer(mix)
    base = run(m, x, pad, True)
    for s in (0, 7, 8, 20, 36):
      x2 = x.copy()
      x2[:, s] += 3 * normal(9 + s, B, E)
      moved = np.abs(run(m, x2, pad, True) - base).max(-1)  # [B, L]
      assert (moved[:, :s] == 0).all(), (mix, s)
      seen = (t >= s) & ((t < s + 8) | (mix == 'sum'))
      assert (moved[0, seen] > 0).all() and (moved[0, ~seen] == 0).all()
      # Example 1 has 30 real tokens: a padded token moves nothing.
      assert (moved[1] > 0).any() == (s < 30), (mix, s)


def test_initialisation():
  m = make(mix='sum', feature_dim=16)
  for lin in (
    m.linear.proj_q,
    m.linear.proj_k,
    m.linear.proj_v,
    m.linear.out_proj,
    m.sliding.qkv,
    m.sliding.out_proj,
  ):
    w = f64(lin.kernel)
    assert 0.012 < w.std() < 0.028, w.std()  # N(0, 0.02^2)
    if lin.bias is not None:
      np.testing.assert_array_equal(f64(lin.bias), 0.0)
  assert m.linear.proj_q.kernel.shape == (E, H * 16)
  assert m.linear.proj_v.kernel.shape == (E, E)
  assert m.sliding.qkv.kernel.shape == (E, 3 * E)
  assert m.linear.proj_q.bias is None and m.sliding.qkv.bias is not None


def test_options_and_registry():
  assert get_core_class('based') is Based
  assert Based.is_mixer and Based.supports_causal
  bad = (
    {'mix': 'both'},
    {'feature_dim': 0},
    {'window': 2.5},
    {'chunk_size': 0},
  )
  for opts in bad:
    with pytest.raises(UserError, match='based') as info:
      make(**opts)
    assert '\n' not in str(info.value)
  with pytest.raises(UserError, match='divisible'):
    Based(
      emb_dim=10,
      num_heads=4,
      max_length=128,
      dropout_rate=0.0,
      dtype=jnp.float32,
      rngs=nnx.Rngs(0),
    )
