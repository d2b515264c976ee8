"""linear_transformer: the kernel identity, chunked causal sums, memory."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models.attention import Mask
from models.attention.kernel_attention import kernel_attention
import models.attention.linear_transformer  # noqa: F401
from models.attention.linear_transformer import elu_features
from models.attention.memory import core_memory_bytes
from tests import attention_oracle as ao

B, H, D = 2, 2, 8


def quadratic_form(phi_q, phi_k, v, allowed):
  """phi(Q) phi(K)^T V / row sums, densely in float64; empty rows -> 0."""
  phi_q, phi_k, v = (np.asarray(t, np.float64) for t in (phi_q, phi_k, v))
  b, length, h, _ = phi_q.shape
  allowed = np.broadcast_to(allowed, (b, h, length, phi_k.shape[1]))
  a = np.einsum('blhf,bmhf->bhlm', phi_q, phi_k) * allowed
  num = np.einsum('bhlm,bmhd->blhd', a, v)
  den = a.sum(-1).transpose(0, 2, 1)[..., None]
  return np.where(den > 0, num / np.where(den > 0, den, 1), 0.0)


@pytest.fixture(scope='module')
def core():
  return ao.make({'name': 'linear_transformer'}, num_heads=H, head_dim=D)


@pytest.mark.parametrize('causal', [False, True])
@pytest.mark.parametrize('padded', [False, True])
def test_equals_quadratic_form(core, causal, padded):
  # L = 100: two causal chunks of 64, the second one padded inside the core.
  length = 100
  q, k, v = ao.qkv(seed=1, batch=B, length=length, heads=H, dim=D)
  pad = ao.padding([length, 61], length) if padded else None
  out = ao.run(core, q, k, v, pad, causal)
  allowed = ao.allowed_mask(ao.full_pattern(length), pad, causal)
  ref = quadratic_form(elu_features(q), elu_features(k), v, allowed)
  real = np.ones((B, length), bool) if pad is None else np.asarray(pad)
  np.testing.assert_allclose(out[real], ref[real], atol=1e-5)
  assert np.isfinite(out).all()


@pytest.mark.parametrize('chunk', [3, 8])
def test_chunked_prefix_sums_match_dense(chunk):
  """The causal scan at any chunk length (incl. one not dividing L)."""
  length = 37
  phi_q, phi_k, v = (
    jnp.abs(t) for t in ao.qkv(seed=2, batch=B, length=length, heads=H, dim=D)
  )
  pad = ao.padding([length, 20], length)
  out = kernel_attention(phi_q, phi_k, v, pad, causal=True, chunk=chunk)
  allowed = ao.allowed_mask(ao.full_pattern(length), pad, causal=True)
  ref = quadratic_form(phi_q, phi_k, v, allowed)
  np.testing.assert_allclose(np.asarray(out), ref, atol=1e-5)


def test_causal_by_gradient(core):
  """Output t depends on every key/value/query <= t and on none after."""
  length = 100
  q, k, v = ao.qkv(seed=3, batch=B, length=length, heads=H, dim=D)
  pad = ao.padding([length, 90], length)

  ts = (0, 10, 63, 64, 80)
  g_Tx3xL = ao.time_gradients(core, q, k, v, ts, pad)
  for g_3xL, t in zip(g_Tx3xL, ts):
    assert (g_3xL[:, t + 1 :] == 0).all(), t  # nothing after t
    assert (g_3xL[1:, : t + 1] > 0).all(), t  # every earlier key and value


@pytest.mark.parametrize('causal', [False, True])
def test_padding_and_empty_rows(core, causal):
  """Padded keys change nothing; an example with no real key gets zeros."""
  length = 24
  q, k, v = ao.qkv(seed=4, batch=B, length=length, heads=H, dim=D)
  pad = ao.padding([length, 0], length)
  loss = lambda q, k, v: core(q, k, v, Mask(pad, causal))[0]  # noqa: E731
  out = np.asarray(jax.jit(loss)(q, k, v))
  np.testing.assert_array_equal(out[1], 0.0)
  assert np.isfinite(out).all()
  pad = ao.padding([length, 11], length)
  out = np.asarray(jax.jit(loss)(q, k, v))
  noise = 1e3 * jax.random.normal(jax.random.key(9), k.shape)
  hide = ~pad[:, :, None, None]
  out2 = jax.jit(loss)(q, jnp.where(hide, noise, k), jnp.where(hide, noise, v))
  np.testing.assert_allclose(np.asarray(out2), out, atol=1e-5)
  grads = jax.jit(jax.grad(lambda *a: loss(*a).sum(), (0, 1, 2)))(q, k, v)
  assert all(np.isfinite(np.asarray(g)).all() for g in grads)


@pytest.mark.parametrize('causal', [False, True])
def test_memory_grows_linearly(causal):
  opts = {'name': 'linear_transformer'}
  small = core_memory_bytes(opts, 1024, causal=causal)
  large = core_memory_bytes(opts, 4096, causal=causal)
  print(
    f'linear_transformer causal={causal}: {small} -> {large} bytes, '
    f'ratio {large / small:.2f}'
  )
  assert large / small <= 5


# The shared suite's settings for this core (tests/test_attention_suite.py).
SUITE = dict(opts={}, exact=None, identity='its kernel identities, this file')
