"""The contract, checked on every registered attention core (the backbone).

For each core: its exact limit against the softmax oracle, padding
invariance, fully padded rows (zeros, finite gradients), causality by
gradient (or a one-sentence refusal), bfloat16, jit. The cores are
enumerated from the registry, so a new core is tested without editing this
file. Its settings come from the module-level dict `SUITE` of its own
tests/test_attn_<name>.py when that file defines one, else DEFAULT: the core
at its default options must then be its own exact softmax limit. A `SUITE`
dict holds:
  opts        options for the runs (small blocks, so patterns are not
              trivially dense at L = 37);
  exact       the options of its exact softmax limit, or None with
  identity    naming the test of its defining identity instead;
  hook        f(core): sets the exact limit's parameters;
  reference   f(q, v, pad, causal): the oracle when it is not plain softmax;
  causal      options for the causal run (None: it refuses causal masks);
  exact_padding / exact_causal  False: the limit holds without padding /
              causal masks only;
  bf16        which options the bfloat16 run uses ('opts' or 'exact');
  rotary_opts, rotary_tol, rotary_scale  for tests/test_positions.py.
Sequence mixers (models/mixers/) have their own suite,
tests/test_mixer_suite.py.
"""

import importlib

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

B, L, H, D = 2, 37, 2, 8
LENGTHS = (L, 20)
# A core without its own SUITE: run at its defaults, which must be exact.
DEFAULT = dict(opts={}, exact={})


def suite_entry(name):
  """The SUITE dict of tests/test_attn_<name>.py, else DEFAULT."""
  try:
    module = importlib.import_module(f'test_attn_{name}')
  except ModuleNotFoundError as e:
    if e.name != f'test_attn_{name}':
      raise
    return dict(DEFAULT)
  return dict(getattr(module, 'SUITE', DEFAULT))


def attention_cores():
  """Registered cores that take q/k/v (not the sequence mixers)."""
  return sorted(
    n for n in known_cores() if not getattr(get_core_class(n), 'is_mixer', 0)
  )


SUITE = {name: suite_entry(name) for name in attention_cores()}
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


def test_every_core_has_an_exact_limit_or_an_identity():
  """A core without a softmax limit names the test of its identity."""
  assert 'softmax' in SUITE and len(SUITE) >= 14
  for name, entry in SUITE.items():
    assert entry['exact'] is not None or entry.get('identity'), name


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
