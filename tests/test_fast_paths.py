"""Issue #25's attention fast paths, checked exact on CPU: the fused core
zero-pads head dims to cuDNN's multiple of 8, and dropout draws its keep mask
from one byte per element on accelerators (models/attention/base.py)."""

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models.attention import Mask, base, build
from models.attention import softmax as softmax_mod
from models.mixers import base as mixer_base

B, L, H = 2, 9, 2  # L odd: the cuDNN path's even-length padding runs too


def make_core(head_dim, implementation, dtype=jnp.float32):
  return build(
    {'name': 'softmax', 'implementation': implementation},
    num_heads=H,
    head_dim=head_dim,
    max_length=L,
    dropout_rate=0.0,
    dtype=dtype,
    rngs=nnx.Rngs(0),
  )


def qkv(head_dim, seed=0):
  keys = jax.random.split(jax.random.key(seed), 3)
  return [jax.random.normal(k, (B, L, H, head_dim)) for k in keys]


def record_calls(monkeypatch):
  """Replaces jax.nn.dot_product_attention with a recorder that runs the
  XLA kernel on the same arguments; returns the list of recorded calls."""
  real = jax.nn.dot_product_attention
  calls = []

  def fake(q, k, v, *args, implementation=None, **kwargs):
    calls.append(
      {
        'implementation': implementation,
        'shapes': (q.shape, k.shape, v.shape),
        'scale': kwargs.get('scale'),
        'q': q,
      }
    )
    return real(q, k, v, *args, implementation='xla', **kwargs)

  monkeypatch.setattr(jax.nn, 'dot_product_attention', fake)
  return calls


@pytest.mark.parametrize('head_dim', [4, 12, 20])
@pytest.mark.parametrize('causal', [False, True])
def test_padded_head_dim_equals_einsum(monkeypatch, head_dim, causal):
  """The cuDNN request's call (run by the XLA kernel with its arguments):
  values and gradients w.r.t. q, k, v equal the einsum core's."""
  calls = record_calls(monkeypatch)
  q, k, v = qkv(head_dim)
  mask = Mask(jnp.arange(L)[None] < jnp.array([L, 5])[:, None], causal)
  einsum = make_core(head_dim, 'einsum')
  fused = make_core(head_dim, 'fused')
  fused.kernel = 'cudnn'  # float32 here: forced, so the values are exact
  weights = jax.random.normal(jax.random.key(7), q.shape)

  @jax.jit
  def values_and_grads(q, k, v):
    """Each core's output and its vjp of `weights` w.r.t. (q, k, v)."""
    outs = []
    for core in (einsum, fused):
      out, vjp = jax.vjp(lambda *qkv: core(*qkv, mask)[0], q, k, v)
      outs.append((out, vjp(weights)))
    return outs

  (want, grads_want), (got, grads_got) = values_and_grads(q, k, v)
  np.testing.assert_allclose(got, want, atol=2e-5)
  for g_got, g_want in zip(grads_got, grads_want):
    assert g_got.shape == (B, L, H, head_dim)
    np.testing.assert_allclose(g_got, g_want, atol=5e-5)
  padded = -(-head_dim // 8) * 8
  assert calls and all(c['implementation'] == 'cudnn' for c in calls)
  for c in calls:
    assert all(s[-1] == padded for s in c['shapes'])
    assert c['scale'] == pytest.approx(head_dim**-0.5)


@pytest.mark.parametrize('head_dim', [4, 12, 20])
def test_cudnn_requested_for_padded_head_dims(monkeypatch, head_dim):
  """With the backend faked as 'gpu' and bfloat16, 'auto' is cuDNN for
  head dims that are no multiple of 8, and the call reaching
  jax.nn.dot_product_attention asks for it with Dp and 1/sqrt(D)."""
  assert (
    softmax_mod.fused_kernel_for('auto', jnp.bfloat16, head_dim, backend='gpu')
    == 'cudnn'
  )
  monkeypatch.setattr(jax, 'default_backend', lambda: 'gpu')
  calls = record_calls(monkeypatch)
  core = make_core(head_dim, 'fused', jnp.bfloat16)
  assert core.kernel == 'cudnn'
  q, k, v = qkv(head_dim, seed=1)
  mask = Mask(jnp.arange(L)[None] < jnp.array([L, 6])[:, None], False)
  half = [t.astype(jnp.bfloat16) for t in (q, k, v)]
  out = core(*half, mask)[0]
  assert out.shape == (B, L, H, head_dim) and out.dtype == jnp.bfloat16
  [call] = calls
  padded = -(-head_dim // 8) * 8
  assert call['implementation'] == 'cudnn'
  assert padded % 8 == 0 and padded > head_dim
  assert call['shapes'] == ((B, L + 1, H, padded),) * 3
  assert call['scale'] == pytest.approx(head_dim**-0.5)
  np.testing.assert_array_equal(np.asarray(call['q'][..., head_dim:]), 0)
  want = make_core(head_dim, 'einsum')(q, k, v, mask)[0]
  np.testing.assert_allclose(np.asarray(out, np.float32), want, atol=0.05)


def test_head_dim_multiple_of_8_is_not_padded(monkeypatch):
  calls = record_calls(monkeypatch)
  q, k, v = qkv(16)
  softmax_mod.cudnn_attention(
    q, k, v, None, causal=False, implementation='cudnn'
  )
  assert calls[0]['shapes'][0][-1] == 16
  assert calls[0]['scale'] == pytest.approx(0.25)


# Dropout: the uint8 rule (accelerators) and the backend switch.


def test_backend_rule():
  assert base.dropout_bits_for('cpu') == 'bernoulli'
  assert base.dropout_bits_for('gpu') == 'uint8'
  assert base.dropout_bits_for('tpu') == 'uint8'
  assert base.uint8_dropout_threshold(0.1) == 26
  assert base.uint8_dropout_threshold(0.5) == 128
  assert base.uint8_dropout_threshold(0.001) is None  # would round to 0
  assert base.uint8_dropout_threshold(jnp.float32(0.1)) is None


def test_uint8_bits_shapes_and_spread():
  key = jax.random.key(3)
  assert base.uint8_bits(key, ()).shape == ()
  assert base.uint8_bits(key, (3, 5)).shape == (3, 5)
  bits = np.asarray(base.uint8_bits(key, (64, 1027)), np.int64)
  assert bits.min() == 0 and bits.max() == 255
  counts = np.bincount(bits.ravel(), minlength=256)
  expected = bits.size / 256
  assert np.abs(counts - expected).max() < 6 * np.sqrt(expected)
  # The four bytes of one word are not copies of each other.
  same = (bits[:, 1:] == bits[:, :-1]).mean()
  assert same < 3 / 256


@pytest.mark.parametrize('rate', [0.05, 0.1, 0.3, 0.5])
def test_uint8_dropout_keep_fraction_scale_and_mean(rate):
  x = jnp.ones((64, 1000), jnp.float32)
  t = round(rate * 256)
  rate_eff = t / 256
  assert abs(rate_eff - rate) <= 1 / 512
  key = jax.random.key(11)
  out = np.asarray(base.dropout(x, rate, key, backend='gpu'))
  kept = out != 0
  sigma = np.sqrt(rate_eff * (1 - rate_eff) / x.size)
  assert abs(kept.mean() - (1 - rate_eff)) < 5 * sigma
  # Kept values scaled by 1/(1 - t/256), not 1/(1 - rate): E[out] = x.
  np.testing.assert_allclose(out[kept], 1 / (1 - rate_eff), rtol=1e-6)
  if rate_eff != rate:
    assert not np.allclose(out[kept], 1 / (1 - rate))
  assert abs(out.mean() - 1.0) < 5 * sigma / (1 - rate_eff)
  again = base.dropout(x, rate, key, backend='gpu')
  np.testing.assert_array_equal(out, again)
  other = base.dropout(x, rate, jax.random.key(12), backend='gpu')
  assert not np.array_equal(out, np.asarray(other))


def test_cpu_unchanged_and_fake_gpu_switches(monkeypatch):
  """On CPU the mask is jax.random.bernoulli's (every number as before);
  faking the backend as 'gpu' switches both dropout helpers to uint8."""
  x = jax.random.normal(jax.random.key(0), (8, 96))
  key = jax.random.key(5)
  bernoulli = jnp.where(
    jax.random.bernoulli(key, 0.9, x.shape), x / 0.9, jnp.zeros_like(x)
  )
  uint8 = base.dropout(x, 0.1, key, backend='gpu')
  assert not np.array_equal(np.asarray(bernoulli), np.asarray(uint8))
  if jax.default_backend() == 'cpu':
    np.testing.assert_array_equal(base.dropout(x, 0.1, key), bernoulli)
    np.testing.assert_array_equal(mixer_base.dropout(x, 0.1, key), bernoulli)
  monkeypatch.setattr(jax, 'default_backend', lambda: 'gpu')
  np.testing.assert_array_equal(base.dropout(x, 0.1, key), uint8)
  np.testing.assert_array_equal(mixer_base.dropout(x, 0.1, key), uint8)
  # A rate the bytes cannot resolve keeps the exact rule.
  np.testing.assert_array_equal(
    base.dropout(x, 0.001, key),
    jnp.where(
      jax.random.bernoulli(key, 0.999, x.shape), x / 0.999, jnp.zeros_like(x)
    ),
  )
  np.testing.assert_array_equal(base.dropout(x, 0.0, key), x)
  np.testing.assert_array_equal(base.dropout(x, 0.1, None), x)


def test_uint8_dropout_under_jit_and_bfloat16():
  x = jnp.ones((4, 33), jnp.bfloat16)
  key = jax.random.key(2)
  f = jax.jit(lambda x, key: base.dropout(x, 0.25, key, backend='gpu'))
  out = f(x, key)
  assert out.dtype == jnp.bfloat16
  np.testing.assert_array_equal(out, base.dropout(x, 0.25, key, backend='gpu'))
  scaled = float(jnp.asarray(4 / 3, jnp.bfloat16))
  assert set(np.unique(np.asarray(out, np.float32)).tolist()) == {0.0, scaled}
