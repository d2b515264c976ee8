"""The contract, checked on every registered core (the backbone suite).

For each core: its exact limit against the softmax oracle, padding
invariance, fully padded rows (zeros, finite gradients), causality by
gradient (or a one-sentence refusal), bfloat16, jit. A core registered
without an entry in SUITE fails `test_every_core_is_in_the_suite`.
"""

from attention_oracle import (
  allowed_mask,
  dense_reference,
  full_pattern,
  make,
  padding,
  qkv,
  run,
  time_gradients,
)
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lra.errors import UserError
from models.attention import Mask, known_cores
from models.attention.registry import get_core_class
from models.attention.relative import zero_positions

B, L, H, D = 2, 37, 2, 8
LENGTHS = (L, 20)


def _identity_projections(core):
  """Linformer's exact limit: k = L and E = F = identity."""
  for name in ('e_MxK', 'f_MxK'):
    p = getattr(core, name, None)
    if p is not None:
      p[...] = jnp.eye(*p[...].shape[-2:]).reshape(p[...].shape)


def _zero_synthetic(core):
  """Synthesizer's exact limit: mixed with q.k and no synthetic logits."""
  for _, p in nnx.iter_graph(core):
    if isinstance(p, nnx.Param):
      p[...] = jnp.zeros_like(p[...])


def reformer_reference(q, v, pad, causal):
  """Softmax over visible j != i of q_i . q_j/|q_j| / sqrt(D); self only
  when nothing else is visible (Reformer's rule, one bucket, one chunk)."""
  k = np.asarray(q) / np.linalg.norm(np.asarray(q), axis=-1, keepdims=True)
  allowed = allowed_mask(full_pattern(L), pad, causal)
  allowed = np.broadcast_to(allowed, (B, 1, L, L)).copy()
  eye = np.eye(L, dtype=bool)
  others = allowed & ~eye
  alone = ~others.any(-1, keepdims=True) & allowed & eye
  return dense_reference(q, k, v, others | alone)


# name -> options used by the suite (small blocks, so patterns are not
# trivially dense at L = 37), the exact-limit options, a hook that sets the
# exact limit's parameters, and options for a causal run (None: refused).
SUITE = {
  'softmax': dict(opts={}, exact={}),
  'local': dict(opts={'block_size': 8}, exact={'block_size': 64}),
  'sparse_transformer': dict(
    opts={'pattern': 'mixed', 'stride': 8, 'summary': 3},
    exact=None,  # a sparsity pattern; its equality is tests/test_attn_*.
  ),
  'longformer': dict(
    opts={'window': 8, 'global_tokens': 2},
    exact={'window': 2 * L, 'global_tokens': 0, 'global_projections': False},
    causal={'window': 8, 'global_tokens': 0},
  ),
  'bigbird': dict(
    opts={'block_size': 4, 'num_random_blocks': 2},
    exact={'block_size': 16, 'num_random_blocks': 0},
  ),
  'sinkhorn': dict(
    opts={'block_size': 8},
    exact={'block_size': 64},
    exact_causal=False,
    causal=None,
  ),
  'synthesizer': dict(
    opts={'mode': 'random'},
    exact={'mode': 'dense', 'mix_dot_product': True},
    hook=_zero_synthetic,
  ),
  'linformer': dict(
    opts={'proj_length': 16},
    exact={'proj_length': L},
    hook=_identity_projections,
    exact_padding=False,
    causal=None,
  ),
  'linear_transformer': dict(opts={}, exact=None),  # kernel identity tests
  'performer': dict(opts={'num_features': 32}, exact=None),
  'reformer': dict(
    opts={'num_buckets': 4, 'chunk_size': 8},
    exact={'num_buckets': 1, 'chunk_size': 64},
    reference=reformer_reference,
    # bf16 rounding moves tokens near a bucket boundary to another bucket.
    bf16='exact',
  ),
  # The recurrent cores called without memory (one segment), with relative
  # positions; zero W_R and u leave plain softmax. Their memory is
  # tests/test_recurrent.py.
  'transformer_xl': dict(
    opts={'relative': True}, exact={'relative': True}, hook=zero_positions
  ),
  'compressive_transformer': dict(
    opts={'relative': True}, exact={'relative': True}, hook=zero_positions
  ),
  'none': dict(opts={}, exact=None),  # the ceiling: no token mixing at all
}
# Cores whose exact limit is not plain softmax attention, with the file that
# tests their defining identity instead.
IDENTITY_TESTED = {
  'sparse_transformer': 'tests/test_attn_sparse_transformer.py',
  'linear_transformer': 'tests/test_attn_linear_transformer.py',
  'performer': 'tests/test_attn_performer.py',
  'none': 'the identity out = v, test_none_is_the_identity',
}
CORES = sorted(SUITE)


def core_for(name, which='opts', **kw):
  return make(
    {'name': name, **SUITE[name][which]},
    num_heads=H,
    head_dim=D,
    max_length=kw.pop('max_length', 64),
    **kw,
  )


def inputs(name, seed=0):
  q, k, v = qkv(seed, B, L, H, D)
  if get_core_class(name).shared_qk:
    k = q
  return q, k, v


def test_every_core_is_in_the_suite():
  assert set(known_cores()) == set(SUITE)
  for name, entry in SUITE.items():
    assert entry['exact'] is not None or name in IDENTITY_TESTED, name


@pytest.mark.parametrize(
  'name', [n for n in CORES if SUITE[n]['exact'] is not None]
)
def test_exact_limit_equals_softmax(name):
  entry = SUITE[name]
  core = core_for(name, 'exact')
  if 'hook' in entry:
    entry['hook'](core)
  q, k, v = inputs(name, 1)
  pad = padding(LENGTHS, L) if entry.get('exact_padding', True) else None
  causal_too = entry.get('exact_causal', get_core_class(name).supports_causal)
  for causal in (False, True) if causal_too else (False,):
    if 'reference' in entry:
      want = entry['reference'](q, v, pad, causal)
    else:
      want = dense_reference(
        q, k, v, allowed_mask(full_pattern(L), pad, causal)
      )
    got = run(core, q, k, v, pad, causal)
    np.testing.assert_allclose(got, want, atol=2e-5, err_msg=str(causal))


@pytest.mark.parametrize('name', CORES)
def test_padding_invariance(name):
  core = core_for(name)
  q, k, v = inputs(name, 2)
  pad = padding(LENGTHS, L)
  out1 = run(core, q, k, v, pad)
  hide = ~pad[:, :, None, None]
  noise = 50 * jax.random.normal(jax.random.key(7), k.shape)
  k2 = jnp.where(hide, noise, k)
  q2 = jnp.where(hide, -noise, q)
  if get_core_class(name).shared_qk:
    q2 = k2
  out2 = run(core, q2, k2, jnp.where(hide, -noise, v), pad)
  real = np.asarray(pad)
  np.testing.assert_allclose(out1[real], out2[real], atol=1e-5)


@pytest.mark.parametrize('name', CORES)
def test_fully_padded_row_is_zero_with_finite_gradients(name):
  core = core_for(name)
  q, k, v = inputs(name, 3)
  pad = padding((L, 0), L)
  out = run(core, q, k, v, pad)
  assert np.isfinite(out).all()
  np.testing.assert_array_equal(out[1], 0.0)

  def loss(q, k, v):
    if get_core_class(name).shared_qk:
      k = q
    return jnp.sum(core(q, k, v, Mask(pad, False))[0] ** 2)

  for g in jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v):
    assert np.isfinite(np.asarray(g)).all()


@pytest.mark.parametrize('name', CORES)
def test_causal_by_gradient_or_refusal(name):
  cls = get_core_class(name)
  entry = SUITE[name]
  q, k, v = inputs(name, 4)
  if not cls.supports_causal or entry.get('causal', {}) is None:
    with pytest.raises(UserError, match=name):
      run(core_for(name), q, k, v, None, True)
    return
  core = core_for(name, 'causal' if 'causal' in entry else 'opts')
  pad = padding(LENGTHS, L)
  ts = (0, 9, 30)
  g_Tx3xL = time_gradients(core, q, k, v, ts, pad)
  for row, t in zip(g_Tx3xL, ts):
    assert (row[:, t + 1 :] == 0).all(), t  # nothing after t
  if name != 'none':  # the output at t does depend on the past
    assert g_Tx3xL[2, 2, :30].sum() > 0


def test_longformer_refuses_causal_with_global_tokens():
  q, k, v = inputs('longformer')
  with pytest.raises(UserError, match='longformer'):
    run(core_for('longformer'), q, k, v, None, True)


@pytest.mark.parametrize('name', CORES)
def test_bfloat16_and_jit(name):
  q, k, v = inputs(name, 5)
  pad = padding(LENGTHS, L)
  which = SUITE[name].get('bf16', 'opts')
  ref = run(core_for(name, which), q, k, v, pad)
  core = core_for(name, which, dtype=jnp.bfloat16)
  graphdef, state = nnx.split(core)

  @jax.jit
  def f(state, q, k, v, pad):
    return nnx.merge(graphdef, state)(q, k, v, Mask(pad, False))[0]

  lo = [t.astype(jnp.bfloat16) for t in (q, k, v)]
  out = f(state, *lo, pad)
  assert out.dtype == jnp.bfloat16
  out = np.asarray(out, np.float32)
  assert np.isfinite(out).all()
  np.testing.assert_allclose(out, ref, atol=0.15)


def test_none_is_the_identity():
  """The ceiling core mixes nothing: out = v where a query sees any key."""
  q, k, v = inputs('none')
  out = run(core_for('none'), q, k, v, padding(LENGTHS, L))
  np.testing.assert_array_equal(out, np.asarray(v))
