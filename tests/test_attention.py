"""The exact softmax core: the oracle every efficient core is tested against."""

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lra.errors import UserError
from models.attention import Mask, build, known_cores

B, L, H, D = 2, 24, 3, 8


def make_core(implementation='einsum', dropout_rate=0.0):
  return build(
    {'name': 'softmax', 'implementation': implementation},
    num_heads=H,
    head_dim=D,
    max_length=L,
    dropout_rate=dropout_rate,
    dtype=jnp.float32,
    rngs=nnx.Rngs(0),
  )


def qkv(seed=0, length=L):
  ks = jax.random.split(jax.random.key(seed), 3)
  return [jax.random.normal(k, (B, length, H, D)) for k in ks]


def padding(lengths, length=L):
  return jnp.arange(length)[None, :] < jnp.asarray(lengths)[:, None]


def reference(q, k, v, allowed):
  """Softmax attention written out independently, per example and head."""
  out = np.zeros(q.shape, np.float64)
  q, k, v = (np.asarray(t, np.float64) for t in (q, k, v))
  for b in range(q.shape[0]):
    for h in range(q.shape[2]):
      s = q[b, :, h] @ k[b, :, h].T / np.sqrt(q.shape[-1])
      s = np.where(allowed[b], s, -np.inf)
      for i in range(s.shape[0]):
        if np.isfinite(s[i]).any():
          w = np.exp(s[i] - s[i].max())
          out[b, i, h] = (w / w.sum()) @ v[b, :, h]
  return out


@pytest.mark.parametrize('implementation', ['einsum', 'fused'])
@pytest.mark.parametrize('causal', [False, True])
def test_matches_written_out_softmax(implementation, causal):
  q, k, v = qkv()
  pad = padding([L, 17])
  allowed = np.asarray(pad)[:, None, :].repeat(L, 1)
  if causal:
    allowed = allowed & np.tril(np.ones((L, L), bool))[None]
  out, aux = make_core(implementation)(q, k, v, Mask(pad, causal))
  assert aux == {}
  np.testing.assert_allclose(out, reference(q, k, v, allowed), atol=2e-5)


@pytest.mark.parametrize('causal', [False, True])
def test_paths_agree(causal):
  q, k, v = qkv(1)
  mask = Mask(padding([L, 5]), causal)
  a, _ = make_core('einsum')(q, k, v, mask)
  b, _ = make_core('fused')(q, k, v, mask)
  np.testing.assert_allclose(a, b, atol=1e-5)


@pytest.mark.parametrize('implementation', ['einsum', 'fused'])
def test_padding_invariance(implementation):
  """Changing padded keys/values changes no output of a real query."""
  q, k, v = qkv(2)
  pad = padding([L, 11])
  core = make_core(implementation)
  out1, _ = core(q, k, v, Mask(pad, False))
  noise = jax.random.normal(jax.random.key(9), k.shape) * 100
  hide = ~pad[:, :, None, None]
  out2, _ = core(
    q, jnp.where(hide, noise, k), jnp.where(hide, -noise, v), Mask(pad, False)
  )
  real = np.asarray(pad)
  np.testing.assert_allclose(
    np.asarray(out1)[real], np.asarray(out2)[real], atol=1e-5
  )


@pytest.mark.parametrize('implementation', ['einsum', 'fused'])
def test_fully_padded_row_gives_zeros_not_nan(implementation):
  q, k, v = qkv(3)
  pad = padding([L, 0])
  core = make_core(implementation)
  out, _ = core(q, k, v, Mask(pad, False))
  assert np.isfinite(np.asarray(out)).all()
  np.testing.assert_array_equal(np.asarray(out)[1], 0.0)
  grads = jax.grad(lambda q: core(q, k, v, Mask(pad, False))[0].sum())(q)
  assert np.isfinite(np.asarray(grads)).all()


def test_causal_by_gradient():
  """Output i depends on no key j > i (nanodo's causality check)."""
  q, k, v = qkv(4)
  core = make_core('einsum')
  i = 7
  g = jax.grad(lambda k: core(q, k, v, Mask(None, True))[0][:, i].sum())(k)
  g = np.abs(np.asarray(g)).sum(axis=(0, 2, 3))
  assert (g[i + 1 :] == 0).all() and (g[: i + 1] > 0).all()


def test_attention_dropout_uses_key():
  q, k, v = qkv(5)
  core = make_core('einsum', dropout_rate=0.5)
  mask = Mask(None, False)
  a, _ = core(q, k, v, mask, rngs=jax.random.key(0))
  b, _ = core(q, k, v, mask, rngs=jax.random.key(0))
  c, _ = core(q, k, v, mask, rngs=jax.random.key(1))
  d, _ = core(q, k, v, mask)
  np.testing.assert_array_equal(a, b)
  assert not np.allclose(a, c)
  np.testing.assert_allclose(d, make_core('einsum')(q, k, v, mask)[0])


def test_bfloat16_inputs_keep_float32_softmax():
  q, k, v = (t.astype(jnp.bfloat16) for t in qkv(6))
  pad = padding([L, 9])
  out, _ = make_core('einsum')(q, k, v, Mask(pad, False))
  ref = make_core('einsum')(*qkv(6), Mask(pad, False))[0]
  assert np.isfinite(np.asarray(out, np.float32)).all()
  np.testing.assert_allclose(np.asarray(out, np.float32), ref, atol=0.1)


def test_registry_errors_name_the_problem():
  assert 'softmax' in known_cores()
  with pytest.raises(UserError, match='known cores: .*softmax'):
    build(
      {'name': 'nope'},
      num_heads=1,
      head_dim=4,
      max_length=4,
      dropout_rate=0.0,
      dtype=jnp.float32,
      rngs=nnx.Rngs(0),
    )
  with pytest.raises(UserError, match="no option 'window'"):
    build(
      {'name': 'softmax', 'window': 3},
      num_heads=1,
      head_dim=4,
      max_length=4,
      dropout_rate=0.0,
      dtype=jnp.float32,
      rngs=nnx.Rngs(0),
    )
  with pytest.raises(UserError, match='no attention dropout'):
    make_core('fused', dropout_rate=0.1)


def test_fused_kernel_choice():
  """'auto' asks for cuDNN only where it can run; 'cudnn' elsewhere is one
  sentence; on this backend the fused core runs (XLA) with the option."""
  from models.attention.softmax import fused_kernel_for

  assert fused_kernel_for('auto', jnp.bfloat16, 64, backend='gpu') == 'cudnn'
  assert fused_kernel_for('auto', jnp.float32, 64, backend='gpu') == 'xla'
  assert fused_kernel_for('auto', jnp.bfloat16, 12, backend='gpu') == 'cudnn'
  assert fused_kernel_for('auto', jnp.bfloat16, 136, backend='gpu') == 'xla'
  assert fused_kernel_for('auto', jnp.bfloat16, 64, backend='cpu') == 'xla'
  assert fused_kernel_for('xla', jnp.bfloat16, 64, backend='gpu') == 'xla'
  with pytest.raises(UserError, match='needs an NVIDIA GPU'):
    fused_kernel_for('cudnn', jnp.bfloat16, 64, backend='cpu')
  with pytest.raises(UserError, match='head dim <= 128 .this is 130'):
    fused_kernel_for('cudnn', jnp.bfloat16, 130, backend='gpu')
  with pytest.raises(UserError, match='Unknown fused_kernel'):
    fused_kernel_for('flash', jnp.bfloat16, 64)


def test_fused_kernel_refusals_at_model_build():
  """cudnn where it cannot run, and black pixels as padding (not a prefix)
  with a kernel that would be cuDNN, are one sentence before training."""
  from configs import pathfinder
  from lra import data as tasks
  from models import classifier

  c = pathfinder.get_config('transformer_fused,smoke')
  task = tasks.get_task('pathfinder')
  c.model.attention.fused_kernel = 'cudnn'
  if jax.default_backend() != 'gpu':
    with pytest.raises(UserError, match='fused_kernel=cudnn cannot run here'):
      classifier.build_model(c, task)
  c.data.black_is_padding = True
  c.dtype = 'bfloat16'
  with pytest.raises(UserError, match='add --config.model.attention.fused'):
    with pytest.MonkeyPatch.context() as mp:
      mp.setattr(jax, 'default_backend', lambda: 'gpu')
      classifier.build_model(c, task)


@pytest.mark.parametrize('causal', [False, True])
def test_even_length_padding_is_exact(causal):
  """The cuDNN path's even-length padding (checked through the XLA kernel,
  which takes the same arguments): odd lengths with and without key padding
  give the einsum core's output."""
  from models.attention.softmax import even_length_attention

  b, n, h, d = 3, 9, 2, 8
  q, k, v = (
    jax.random.normal(jax.random.key(i), (b, n, h, d)) for i in range(3)
  )
  lengths = jnp.array([9, 5, 1], jnp.int32)
  real = jnp.arange(n)[None] < lengths[:, None]
  for key_lengths, padding in ((None, None), (lengths, real)):
    want, _ = make_core('einsum')(
      q, k, v, Mask(key_padding_BxM=padding, causal=causal)
    )
    got = even_length_attention(
      q,
      k,
      v,
      key_lengths,
      causal=causal,
      scale=d**-0.5,
      implementation='xla',
    )
    np.testing.assert_allclose(got, want, atol=1e-5)
