"""Reformer's memory tricks for any attention: reversible blocks
(models/reversible.py) and the chunked feed-forward (model.ffn_chunks)."""

import json
import os
import subprocess
import sys
import types

import chex
from flax import nnx
import jax
import jax.numpy as jnp
from jax.test_util import check_grads
import ml_collections
import numpy as np
import pytest

from configs import listops as listops_config
from lra import data as tasks
from lra.errors import UserError
from models.attention import Mask
from models.attention.memory import compiled_memory
from models.classifier import build_model
from models.layers import TransformerBlock, checked_ffn_chunks, split_key
from models.reversible import (
  block_functions,
  rebuild_inputs,
  reversible_sequence,
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def smoke_config(**model):
  c = listops_config.get_config('transformer,smoke')
  c.unlock()
  max_length = model.pop('max_length', None)
  if max_length:
    c.max_length = max_length
  c.model.update(model)
  return c


def tokens(batch, length, seed=0):
  """ListOps-like tokens with trailing padding (id 0) in the second row."""
  t = jax.random.randint(jax.random.key(seed), (batch, length), 1, 15)
  return t.at[1, length // 2 :].set(0)


@pytest.fixture(scope='module')
def blocks():
  """Two tiny softmax TransformerBlocks with dropout, and their inputs."""
  cfg = smoke_config(dropout_rate=0.2, attention_dropout_rate=0.2).model
  rngs = nnx.Rngs(0)
  blocks = [
    TransformerBlock(
      cfg, max_length=24, dtype=jnp.float32, rngs=rngs, layer_index=i
    )
    for i in range(2)
  ]
  x_BxLxE = jax.random.normal(jax.random.key(1), (2, 24, cfg.emb_dim))
  padding_BxL = jnp.arange(24)[None, :] < jnp.array([[24], [13]])
  keys = split_key(jax.random.key(2), 2)
  return blocks, x_BxLxE, Mask(padding_BxL, False), keys


def plain_sequence(fs, gs, params, x1, x2, consts):
  """The same equations as reversible_sequence, left to plain autodiff."""
  aux = jnp.zeros((), jnp.float32)
  for f, g, p, c in zip(fs, gs, params, consts):
    h, a = f(p, x2, c)
    x1 = x1 + h
    x2 = x2 + g(p, x1, c)
    aux = aux + a
  return x1, x2, aux


def test_inputs_rebuilt_from_outputs_equal_the_originals(blocks):
  blocks, x_BxLxE, mask, keys = blocks
  fs, gs, params, consts = block_functions(blocks, mask, keys)
  other = block_functions(blocks, mask, split_key(jax.random.key(9), 2))[3]

  @jax.jit
  def run(params, x1, x2, consts, other):
    y1, y2, _ = reversible_sequence(fs, gs, params, x1, x2, consts)
    rebuilt = rebuild_inputs(fs, gs, params, y1, y2, consts)
    wrong = rebuild_inputs(fs, gs, params, y1, y2, other)
    return y1, rebuilt, wrong

  x1 = x_BxLxE
  x2 = x_BxLxE + 0.5 * jax.random.normal(jax.random.key(3), x_BxLxE.shape)
  y1, (r1, r2), (w1, _) = run(params, x1, x2, consts, other)
  assert float(jnp.max(jnp.abs(y1 - x1))) > 0.1  # the blocks do something
  np.testing.assert_allclose(r1, x1, atol=2e-5)
  np.testing.assert_allclose(r2, x2, atol=2e-5)
  # Other dropout keys in the rebuild do not give the inputs back: the keys
  # really are the forward pass's.
  assert float(jnp.max(jnp.abs(w1 - x1))) > 1e-2


def test_custom_vjp_gradients_equal_plain_autodiff(blocks):
  blocks, x_BxLxE, mask, keys = blocks
  fs, gs, params, consts = block_functions(blocks, mask, keys)
  w1, w2 = jax.random.normal(jax.random.key(4), (2, *x_BxLxE.shape))

  def loss(sequence):
    def f(params, x1, x2):
      y1, y2, aux = sequence(fs, gs, params, x1, x2, consts)
      return jnp.sum(y1 * w1) + jnp.sum(y2 * w2) + aux

    return jax.jit(jax.grad(f, argnums=(0, 1, 2)))

  x2 = x_BxLxE * 0.7
  want = loss(plain_sequence)(params, x_BxLxE, x2)
  got = loss(reversible_sequence)(params, x_BxLxE, x2)
  flat_want, flat_got = jax.tree.leaves(want), jax.tree.leaves(got)
  assert len(flat_want) == len(flat_got) > 20
  # Relative to the largest gradient: the key bias's true gradient is zero
  # (softmax ignores a shift shared by all keys), so it is rounding noise.
  scale = max(float(jnp.max(jnp.abs(a))) for a in flat_want)
  for a, b in zip(flat_want, flat_got):
    np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-6 * scale)


def test_custom_vjp_in_float64_with_an_aux_loss():
  """check_grads (numerical differences) and plain autodiff, in float64."""
  with jax.enable_x64(True):
    k = jax.random.split(jax.random.key(0), 4)
    params = [
      {'a': jax.random.normal(k[i], (4, 4), jnp.float64) / 2} for i in range(3)
    ]
    x1 = jax.random.normal(k[3], (2, 5, 4), jnp.float64)
    x2 = jnp.cos(x1)
    consts = [jnp.full((), i + 1.0, jnp.float64) for i in range(3)]

    def f(p, x, c):
      h = jnp.tanh(x @ p['a']) * c
      return h, jnp.sum(h**2) * 0.1

    def g(p, x, c):
      return jnp.sin(x @ p['a'].T) / c

    fs, gs = [f] * 3, [g] * 3

    def loss(sequence):
      def fn(params, x1, x2):
        y1, y2, aux = sequence(fs, gs, params, x1, x2, consts)
        return jnp.sum(y1 * jnp.sin(y2)) + aux

      return fn

    check_grads(loss(reversible_sequence), (params, x1, x2), 1, ('rev',))
    want = jax.grad(loss(plain_sequence), argnums=(0, 1, 2))(params, x1, x2)
    got = jax.grad(loss(reversible_sequence), argnums=(0, 1, 2))(params, x1, x2)
    chex.assert_trees_all_close(got, want, rtol=1e-9, atol=1e-9)
    r1, r2 = rebuild_inputs(
      fs,
      gs,
      params,
      *plain_sequence(fs, gs, params, x1, x2, consts)[:2],
      consts,
    )
    np.testing.assert_allclose(r1, x1, atol=1e-12)
    np.testing.assert_allclose(r2, x2, atol=1e-12)


@pytest.fixture(scope='module')
def listops():
  return tasks.get_task('listops')


def test_reversible_model_trains_and_ignores_padding(listops):
  config = smoke_config(reversible=True, num_layers=2)
  graphdef, state = nnx.split(build_model(config, listops))
  t = tokens(2, config.max_length)
  half = config.max_length // 2

  def loss(state, key):
    logits, _ = nnx.merge(graphdef, state)(t, key=key)
    return jnp.sum(jax.nn.log_softmax(logits)[:, 0])

  @jax.jit
  def run(state):
    model = nnx.merge(graphdef, state)
    logits, aux = model(t)
    # A training step's gradient, dropout on.
    grads = jax.grad(loss)(state, jax.random.key(0))
    return logits, aux, model(t[:, :half])[0], grads

  logits, aux, logits_half, grads = run(state)
  assert logits.shape == (2, listops.num_classes)
  assert np.all(np.isfinite(logits)) and float(aux['aux_loss']) == 0.0
  # Padded positions are masked: row 1 (real tokens only in its first half)
  # gives the same logits without its padded half.
  np.testing.assert_allclose(logits_half[1], logits[1], atol=1e-5)
  assert all(np.all(np.isfinite(g)) for g in jax.tree.leaves(grads))
  fc1 = grads['encoder']['blocks'][0]['mlp']['fc1']['kernel'][...]
  assert float(jnp.max(jnp.abs(fc1))) > 0


def training_step_memory(config, task, batch, key):
  """compiled_memory of jit(grad of the loss) of the model, not run."""
  graphdef, state = nnx.split(build_model(config, task))

  def loss(state, tokens_BxL, key):
    logits, aux = nnx.merge(graphdef, state)(tokens_BxL, key=key)
    return jnp.sum(jax.nn.log_softmax(logits)[:, 0]) + aux['aux_loss']

  tokens_BxL = jax.ShapeDtypeStruct((batch, config.max_length), jnp.int32)
  step = jax.jit(jax.grad(loss)).lower(state, tokens_BxL, key)
  return compiled_memory(step.compile())


def compare_memory(task, key, length):
  sizes = dict(num_layers=6, emb_dim=32, qkv_dim=32, mlp_dim=64)
  plain = training_step_memory(
    smoke_config(max_length=length, **sizes), task, 2, key
  )
  rev = training_step_memory(
    smoke_config(max_length=length, reversible=True, **sizes), task, 2, key
  )
  print(
    f'6 layers, L={length}, emb 32, batch 2, key={key is not None}: '
    f'temp {plain["temp"] / 1e6:.1f} MB plain, {rev["temp"] / 1e6:.1f} MB '
    f'reversible; peak {plain["peak"] / 1e6:.1f} / {rev["peak"] / 1e6:.1f} MB'
  )
  return plain, rev


def test_reversible_model_needs_less_training_memory(listops):
  """Deterministic (no dropout keys): measured temp 20.3 MB -> 4.8 MB at
  L=256 (the activations of one block instead of six)."""
  plain, rev = compare_memory(listops, None, 256)
  assert rev['peak'] < plain['peak']
  assert rev['temp'] < 0.5 * plain['temp']


@pytest.mark.slow
def test_reversible_training_step_with_dropout_needs_less_memory(listops):
  """With dropout keys, as train.py's step: measured temp 36.2 MB -> 9.2 MB
  (20-60 s of compiling on 2 busy cores)."""
  plain, rev = compare_memory(listops, jax.random.key(0), 256)
  assert rev['peak'] < plain['peak']
  assert rev['temp'] < 0.5 * plain['temp']


def test_ffn_chunks_equal_one_chunk_on_a_whole_model(listops):
  # 64 tokens + CLS = 65: not a multiple of 4, so the padding is exercised.
  t = tokens(2, 64)

  def logits_and_grads(**model):
    graphdef, state = nnx.split(build_model(smoke_config(**model), listops))
    f = lambda s: nnx.merge(graphdef, s)(t)[0]  # noqa: E731
    loss = lambda s: jnp.sum(f(s) ** 2)  # noqa: E731
    return jax.jit(lambda s: (f(s), jax.grad(loss)(s)))(state)

  for reversible in (False, True):
    one, grads_one = logits_and_grads(reversible=reversible, num_layers=2)
    four, grads_four = logits_and_grads(
      reversible=reversible, num_layers=2, ffn_chunks=4
    )
    np.testing.assert_allclose(four, one, atol=1e-6)
    grads_one, grads_four = (
      jax.tree.leaves(grads_one),
      jax.tree.leaves(grads_four),
    )
    scale = max(float(jnp.max(jnp.abs(g))) for g in grads_one)
    for a, b in zip(grads_one, grads_four):
      np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-6 * scale)


def test_ffn_chunks_reduce_the_feed_forward_memory():
  """Forward + backward of one block's feed-forward, hidden [2, 1024, 512]:
  measured temp 14.4 MB with 1 chunk, 6.0 MB with 4 (no dropout)."""

  def temp(n):
    cfg = smoke_config(emb_dim=32, mlp_dim=512, ffn_chunks=n).model
    block = TransformerBlock(
      cfg, max_length=1024, dtype=jnp.float32, rngs=nnx.Rngs(0)
    )
    graphdef, state = nnx.split(block)
    loss = lambda s, x: jnp.sum(nnx.merge(graphdef, s).mlp_branch(x) ** 2)  # noqa: E731
    x_BxLxE = jax.ShapeDtypeStruct((2, 1024, 32), jnp.float32)
    step = jax.jit(jax.grad(loss)).lower(state, x_BxLxE).compile()
    return compiled_memory(step)['temp']

  one, four = temp(1), temp(4)
  print(f'ffn temp {one / 1e6:.1f} MB 1 chunk, {four / 1e6:.1f} MB 4')
  assert four < 0.6 * one, (one, four)


def test_chunked_dropout_has_the_same_rate():
  cfg = smoke_config(dropout_rate=0.5, ffn_chunks=3).model
  block = TransformerBlock(
    cfg, max_length=40, dtype=jnp.float32, rngs=nnx.Rngs(0)
  )
  x_BxLxE = jax.random.normal(jax.random.key(0), (2, 40, cfg.emb_dim))
  chunked = block.mlp_branch(x_BxLxE)
  block.ffn_chunks = 1
  np.testing.assert_allclose(block.mlp_branch(x_BxLxE), chunked, atol=1e-6)
  key = jax.random.key(1)
  unchunked = block.mlp_branch(x_BxLxE, key=key)
  block.ffn_chunks = 3
  chunked = block.mlp_branch(x_BxLxE, key=key)
  assert chunked.shape == x_BxLxE.shape
  # The output dropout zeroes half the entries either way; the draws differ.
  for out in (unchunked, chunked):
    assert 0.45 < float(jnp.mean(out == 0)) < 0.55
  assert not np.allclose(chunked, unchunked)
  # The same key gives the same chunked draw (deterministic from the key).
  np.testing.assert_array_equal(block.mlp_branch(x_BxLxE, key=key), chunked)


@pytest.mark.parametrize('bad', [0, -2])
def test_bad_ffn_chunks_is_a_user_error(listops, bad):
  with pytest.raises(UserError, match='ffn_chunks'):
    build_model(smoke_config(ffn_chunks=bad), listops)


@pytest.mark.parametrize('bad', [1.5, True])
def test_ffn_chunks_of_another_type_is_a_user_error(bad):
  with pytest.raises(UserError, match='ffn_chunks'):
    checked_ffn_chunks(types.SimpleNamespace(ffn_chunks=bad))


def test_bad_reversible_is_a_user_error(listops):
  config = smoke_config()
  config.model = ml_collections.ConfigDict(
    {**config.model.to_dict(), 'reversible': 'yes'}
  )
  with pytest.raises(UserError, match='reversible'):
    build_model(config, listops)


@pytest.mark.slow
def test_train_py_runs_a_reversible_chunked_model(tmp_path):
  """The whole train step path (sharded over the 4 test devices), then
  eval.py on the saved config (13-21 s on 2 busy cores)."""
  data_dir = str(tmp_path / 'data')
  tasks.get_task('listops').ensure_prepared(
    data_dir, {'variant': 'smoke'}, False
  )
  workdir = str(tmp_path / 'run')
  common = dict(cwd=ROOT, capture_output=True, text=True, timeout=300)
  proc = subprocess.run(
    [
      sys.executable,
      'train.py',
      '--config=configs/listops.py:transformer,smoke',
      f'--workdir={workdir}',
      f'--config.data_dir={data_dir}',
      '--config.model.reversible=True',
      '--config.model.ffn_chunks=3',
    ],
    **common,
  )
  assert proc.returncode == 0, proc.stderr
  results = json.load(open(os.path.join(workdir, 'results.json')))
  assert np.isfinite(results['test']['loss'])
  proc = subprocess.run(
    [sys.executable, 'eval.py', f'--workdir={workdir}', '--split=val'],
    **common,
  )
  assert proc.returncode == 0, proc.stderr
  ev = json.load(open(os.path.join(workdir, 'eval_val_best.json')))
  assert ev['accuracy'] == results['val']['accuracy']
