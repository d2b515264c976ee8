"""Segment recurrence (models/recurrent.py), transformer_xl,
compressive_transformer and relative positions (models/attention/relative.py).

The relative logits against a float64 oracle that builds the encoding of
every (query, key) offset explicitly; the XL recurrence against one pass over
the concatenated segments with a banded mask, layer by layer; the memory's
stop-gradient; the compressive memory at rate 1 against XL; the
reconstruction loss and its weight in the training loss; shift equivariance;
segment padding; the compiled training step's memory against the length.
The contract checks (padding, causality, bfloat16, exact limit without
memory) are tests/test_attention_suite.py's; smoke runs on every task are
tests/test_models_tasks.py's.
"""

import os
import subprocess
import sys

from attention_oracle import make, padding, qkv, run
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import listops as listops_config
from lra import data as tasks
from lra.errors import UserError
from lra.train import build, steps
from models.attention import Mask
from models.attention.memory import compiled_memory
from models.classifier import build_model
from models.encoder import Encoder
from models.layers import TransformerBlock
from models.positions import rotate
from models.recurrent import SegmentRecurrentEncoder

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
B, H, D = 2, 2, 8
C = 6  # segment length of the core-level tests


def smoke_config(model='transformer_xl', **changes):
  """The ListOps smoke config of `model`, unlocked, no dropout, changed by
  dotted keys (model.attention.* included)."""
  c = listops_config.get_config(f'{model},smoke')
  c.unlock()
  c.model.dropout_rate = 0.0
  c.model.attention_dropout_rate = 0.0
  for key, value in changes.items():
    *parents, leaf = key.split('.')
    node = c
    for p in parents:
      node = node[p]
    node[leaf] = value
  return c


# ------------------------------------------------------------------ oracle
def sinusoid(positions, width):
  """float64 [P, width]: sin on even, cos on odd features (Vaswani et al.),
  written out here apart from models/embeddings.py."""
  inv = 10000.0 ** (-np.arange(0, width, 2) / width)
  angle = np.asarray(positions, np.float64)[:, None] * inv[None, :]
  out = np.zeros((len(positions), width))
  out[:, 0::2], out[:, 1::2] = np.sin(angle), np.cos(angle)
  return out


def relative_oracle(q, k, v, allowed, rel):
  """float64 Transformer-XL attention, the encoding of each (i, j) offset
  built explicitly: softmax((q_i + u).k_j + (q_i + v).W_R R(i' - j)) over
  allowed [B, L, K] keys, with query i at key position i' = K - L + i; a
  row with no allowed key gives zeros."""
  q, k, v = (np.asarray(t, np.float64) for t in (q, k, v))
  b, length, h, d = q.shape
  klen = k.shape[1]
  u = np.asarray(rel.u_HxD[...], np.float64)
  bias_v = np.asarray(rel.v_HxD[...], np.float64)
  w_r = np.asarray(rel.w_r_ExE[...], np.float64)
  offsets = (klen - length) + np.arange(length)[:, None] - np.arange(klen)
  r_LxKxHxD = (sinusoid(offsets.ravel(), h * d) @ w_r).reshape(
    length, klen, h, d
  )
  logits = np.einsum('blhd,bkhd->bhlk', q + u, k)
  logits += np.einsum('blhd,lkhd->bhlk', q + bias_v, r_LxKxHxD)
  logits *= d**-0.5
  allowed = np.broadcast_to(np.asarray(allowed)[:, None], logits.shape)
  logits = np.where(allowed, logits, -np.inf)
  top = logits.max(-1, keepdims=True)
  w = np.where(allowed, np.exp(logits - np.where(np.isfinite(top), top, 0)), 0)
  w /= np.maximum(w.sum(-1, keepdims=True), 1e-300)
  return np.einsum('bhlk,bkhd->blhd', w, v)


def core(name='transformer_xl', **options):
  return make(
    {'name': name, 'relative': True, **options}, num_heads=H, head_dim=D
  )


def segments(n, seed=0, lengths=((C, C, C, C), (C, 2, 0, C))):
  """n segments of (q, k, v, key padding [B, C]); the second example has
  padding inside a segment and a fully padded one."""
  out = []
  for t in range(n):
    q, k, v = qkv(seed + t, B, C, H, D)
    pad = padding([row[t % len(row)] for row in lengths], C)
    out.append((q, k, v, pad))
  return out


def run_core(core, segs, causal=False):
  """The core over segments in order, memory carried: (outputs, losses)."""

  @jax.jit
  def f(segs):
    memory = core.initial_memory(B, C, jnp.float32)
    outs, losses = [], []
    for q, k, v, pad in segs:
      out, aux = core(q, k, v, Mask(pad, causal), memory=memory)
      memory = aux['memory']
      outs.append(out)
      losses.append(aux.get('loss', jnp.zeros(())))
    return outs, losses

  outs, losses = f(segs)
  return [np.asarray(o, np.float64) for o in outs], np.asarray(losses)


# ------------------------------------------------------- relative positions
@pytest.mark.parametrize('causal', [False, True])
def test_xl_core_with_memory_equals_dense_relative_oracle(causal):
  """Terms a + b + c + d through the relative shift, with a memory: the
  second segment attends over [segment 1; segment 2] at offsets K - L + i
  - j, padded keys of either segment hidden; the `causal` option hides the
  later keys of a query's own segment (the mask's causal flag is the
  suite's)."""
  xl = core(causal=causal)
  (q1, k1, v1, p1), (q2, k2, v2, p2) = segs = segments(2)
  out1, out2 = run_core(xl, segs)[0]
  keys, values = jnp.concatenate([k1, k2], 1), jnp.concatenate([v1, v2], 1)
  allowed = np.concatenate([p1, p2], 1)[:, None, :]
  allowed1 = np.asarray(p1)[:, None, :]
  if causal:
    allowed = allowed & np.tril(np.ones((C, 2 * C), bool), C)
    allowed1 = allowed1 & np.tril(np.ones((C, C), bool))
  np.testing.assert_allclose(
    out2, relative_oracle(q2, keys, values, allowed, xl.rel), atol=2e-5
  )
  np.testing.assert_allclose(
    out1, relative_oracle(q1, k1, v1, allowed1, xl.rel), atol=2e-5
  )


def test_softmax_relative_equals_oracle_and_shifts_with_the_sequence():
  """positions='relative' in the exact core; padding n keys in front of
  the sequence moves every real output by n and changes none (offsets,
  not positions); the relative terms do matter."""
  sm = core('softmax')
  q, k, v = qkv(3, B, 11, H, D)
  pad = padding((11, 7), 11)
  got = run(sm, q, k, v, pad)
  want = relative_oracle(q, k, v, np.asarray(pad)[:, None, :], sm.rel)
  np.testing.assert_allclose(got, want, atol=2e-5)
  n = 5
  shift = lambda t: jnp.pad(t, [(0, 0), (n, 0), (0, 0), (0, 0)])  # noqa: E731
  front = jnp.concatenate([jnp.zeros((B, n), bool), pad], 1)
  for c in (sm, core()):
    plain = run(c, q, k, v, pad)
    shifted = run(c, shift(q), shift(k), shift(v), front)
    real = np.asarray(pad)
    np.testing.assert_allclose(shifted[:, n:][real], plain[real], atol=1e-5)
  absolute = make({'name': 'softmax'}, num_heads=H, head_dim=D)
  assert np.abs(run(absolute, q, k, v, pad) - got).max() > 1e-2


def test_relative_needs_a_core_that_owns_it():
  with pytest.raises(UserError, match="'local' has no relative positions"):
    build_model(smoke_config('local', **{'model.positions': 'relative'}),
                tasks.get_task('listops'))  # fmt: skip
  with pytest.raises(UserError, match='fused softmax path has no relative'):
    make(
      {'name': 'softmax', 'implementation': 'fused', 'relative': True},
      dropout_rate=0.0,
    )


# ------------------------------------------------------------- recurrence
@pytest.fixture(scope='module')
def xl_blocks():
  """Two TransformerBlocks with transformer_xl cores (memory = segment)."""
  cfg = smoke_config().model
  rngs = nnx.Rngs(0)
  return [
    TransformerBlock(cfg, max_length=C, dtype=jnp.float32, rngs=rngs,
                     layer_index=i)
    for i in range(2)
  ]  # fmt: skip


def recurrence(blocks, x_BxTxE, pad_BxT):
  """Blocks over the segments of C in a Python loop, memory carried: the
  outputs of every layer, [B, T, E] each."""
  memories = [blk.attn.core.initial_memory(B, C, jnp.float32) for blk in blocks]
  per_layer = [[] for _ in blocks]
  for t in range(x_BxTxE.shape[1] // C):
    x = x_BxTxE[:, t * C : (t + 1) * C]
    mask = Mask(pad_BxT[:, t * C : (t + 1) * C], False)
    for n, blk in enumerate(blocks):
      x, aux = blk(x, mask, memory=memories[n])
      memories[n] = aux['memory']
      per_layer[n].append(x)
  return [jnp.concatenate(p, 1) for p in per_layer]


def banded_pass(blocks, x_BxTxE, pad_BxT):
  """One pass over all segments, each position seeing its own segment and
  the previous one (the relative oracle, float64): every layer's output."""
  b, total, _ = x_BxTxE.shape
  seg = np.arange(total) // C
  band = (seg[:, None] - seg[None, :] >= 0) & (seg[:, None] - seg[None, :] <= 1)
  allowed = band[None] & np.asarray(pad_BxT)[:, None, :]
  outs = []
  for blk in blocks:
    a = blk.attn
    h = blk.ln_attn(x_BxTxE)
    q, k, v = (f(h).reshape(b, total, H, D) for f in (a.query, a.key, a.value))
    o = relative_oracle(q, k, v, allowed, a.core.rel)
    x_BxTxE = x_BxTxE + a.out(jnp.asarray(o, jnp.float32).reshape(b, total, -1))
    x_BxTxE = x_BxTxE + blk.mlp_branch(x_BxTxE)
    outs.append(np.asarray(x_BxTxE))
  return outs


def test_xl_recurrence_equals_banded_pass_at_every_layer(xl_blocks):
  """Three segments with memory = one pass over their concatenation with a
  banded mask, layer by layer (padding inside a segment and a fully padded
  one in the second example)."""
  x = jax.random.normal(jax.random.key(0), (B, 3 * C, 16))
  pad = jnp.concatenate(
    [padding((C, C), C), padding((C, 2), C), padding((C, 0), C)], 1
  )
  got = jax.jit(lambda x, pad: recurrence(xl_blocks, x, pad))(x, pad)
  want = banded_pass(xl_blocks, x, pad)
  for n, (g, w) in enumerate(zip(got, want)):
    np.testing.assert_allclose(np.asarray(g), w, atol=1e-5, err_msg=str(n))


def test_rotary_recurrence_sees_true_offsets_across_segments():
  """Under rotary positions the recurrent encoder passes each segment's
  start as the rotation offset, so XL (relative off) with memory equals one
  softmax pass over the concatenation with the banded mask and q, k rotated
  at their positions in the whole input."""
  cfg = smoke_config(**{'model.positions': 'rotary'}).model
  blk = TransformerBlock(
    cfg, max_length=C, dtype=jnp.float32, rngs=nnx.Rngs(1), layer_index=0
  )
  x = jax.random.normal(jax.random.key(2), (B, 3 * C, 16))
  pad = jnp.concatenate(
    [padding((C, C), C), padding((C, 2), C), padding((C, 0), C)], 1
  )
  memory = blk.attn.core.initial_memory(B, C, jnp.float32)
  got = []
  for t in range(3):
    out, aux = blk.attn(
      blk.ln_attn(x[:, t * C : (t + 1) * C]),
      Mask(pad[:, t * C : (t + 1) * C], False),
      memory=memory,
      offset=t * C,
    )
    memory = aux['memory']
    got.append(out)
  a = blk.attn
  h = blk.ln_attn(x)
  q, k, v = (f(h).reshape(B, 3 * C, H, D) for f in (a.query, a.key, a.value))
  q, k = rotate(q), rotate(k)
  seg = np.arange(3 * C) // C
  band = (seg[:, None] - seg[None, :] >= 0) & (seg[:, None] - seg[None, :] <= 1)
  allowed = band[None, None] & np.asarray(pad)[:, None, None, :]
  logits = np.einsum('blhd,bmhd->bhlm', np.float64(q), np.float64(k)) / np.sqrt(
    D
  )
  logits = np.where(allowed, logits, -np.inf)
  w = np.exp(logits - logits.max(-1, keepdims=True))
  w = np.where(allowed, w, 0)
  w = w / np.maximum(w.sum(-1, keepdims=True), 1e-300)
  o = np.einsum('bhlm,bmhd->blhd', w, np.float64(v)).reshape(B, 3 * C, -1)
  real = np.asarray(pad)[:, :, None]
  want = np.where(real, np.asarray(a.out(jnp.asarray(o, jnp.float32))), 0)
  got = np.where(real, np.asarray(jnp.concatenate(got, 1)), 0)
  np.testing.assert_allclose(got, want, atol=1e-5)


def pia_block(model='transformer_xl', seed=1, **options):
  """A TransformerBlock under 'pia' positions (no relative positions), its
  core's options changed by `options`."""
  changes = {f'model.attention.{k}': v for k, v in options.items()}
  cfg = smoke_config(model, **{'model.positions': 'pia', **changes}).model
  return TransformerBlock(
    cfg, max_length=C, dtype=jnp.float32, rngs=nnx.Rngs(seed), layer_index=0
  )


@pytest.mark.parametrize('positions', ['pia', 'none'])
def test_pia_memory_key_differs_from_current_key_of_same_content(
  positions, monkeypatch
):
  """Two identical segments: under pia over the window [memory; segment] a
  memory key and a current key with the same content and in-segment offset
  get different scores (the memory at positions 0 .. C-1, the segment at
  C .. 2C-1); without positions they get the same (the check can fail)."""
  import models.attention.transformer_xl as xl_module

  seen, softmax = [], xl_module.masked_softmax

  def record(logits, allowed):  # the core's logits, as it attends
    seen.append(np.asarray(logits))
    return softmax(logits, allowed)

  monkeypatch.setattr(xl_module, 'masked_softmax', record)
  cfg = smoke_config(**{'model.positions': positions}).model
  blk = TransformerBlock(
    cfg, max_length=C, dtype=jnp.float32, rngs=nnx.Rngs(1), layer_index=0
  )
  h = jax.random.normal(jax.random.key(3), (B, C, 16))
  mask = Mask(jnp.ones((B, C), bool), False)
  memory = blk.attn.core.initial_memory(B, C, jnp.float32)
  _, aux = blk.attn(h, mask, memory=memory)
  blk.attn(h, mask, memory=aux['memory'])
  logits_BxHxCx2C = seen[-1]
  assert logits_BxHxCx2C.shape == (B, H, C, 2 * C)
  gap = np.abs(logits_BxHxCx2C[..., :C] - logits_BxHxCx2C[..., C:])
  if positions == 'none':
    np.testing.assert_allclose(gap, 0.0, atol=1e-5)
  else:  # every (query, offset) pair
    assert gap.min() > 1e-4, gap.min()


def test_pia_recurrence_equals_shortformer_window_oracle():
  """XL (memory = segment) under pia over three segments, padding inside a
  segment and a fully padded one, equals a float64 oracle of Shortformer's
  cached window: for segment t, the window [x_(t-1); x_t] (zeros and all
  masked before the first) at positions 0 .. 2C-1 added to the inputs of the
  key projection and, for the last C, of the query projection, values
  position-free."""
  blk = pia_block()
  a = blk.attn
  x = jax.random.normal(jax.random.key(4), (B, 3 * C, 16))
  pad = jnp.concatenate(
    [padding((C, C), C), padding((C, 2), C), padding((C, 0), C)], 1
  )
  w = {n: np.float64(getattr(a, n).kernel[...]) for n in ('query', 'key')}
  w_v, w_o = np.float64(a.value.kernel[...]), np.float64(a.out.kernel[...])
  pos_2CxE = sinusoid(np.arange(2 * C), 16)
  memory = a.core.initial_memory(B, C, jnp.float32)
  h_prev, valid_prev = np.zeros((B, C, 16)), np.zeros((B, C), bool)
  for t in range(3):
    h = blk.ln_attn(x[:, t * C : (t + 1) * C])
    pad_t = pad[:, t * C : (t + 1) * C]
    out, aux = a(h, Mask(pad_t, False), memory=memory)
    memory = aux['memory']
    win = np.concatenate([h_prev, np.float64(h)], 1)
    q = ((win[:, C:] + pos_2CxE[C:]) @ w['query']).reshape(B, C, H, D)
    k = ((win + pos_2CxE) @ w['key']).reshape(B, 2 * C, H, D)
    v = (win @ w_v).reshape(B, 2 * C, H, D)
    allowed = np.concatenate([valid_prev, np.asarray(pad_t)], 1)
    logits = np.einsum('blhd,bkhd->bhlk', q, k) / np.sqrt(D)
    logits = np.where(allowed[:, None, None], logits, -np.inf)
    top = logits.max(-1, keepdims=True)
    e = np.exp(logits - np.where(np.isfinite(top), top, 0))
    e = np.where(allowed[:, None, None], e, 0)
    e = e / np.maximum(e.sum(-1, keepdims=True), 1e-300)
    o = np.einsum('bhlk,bkhd->blhd', e, v).reshape(B, C, -1) @ w_o
    np.testing.assert_allclose(np.asarray(out), o, atol=1e-5, err_msg=str(t))
    h_prev, valid_prev = np.float64(h), np.asarray(pad_t)


def test_pia_compressive_at_rate_1_equals_xl_with_the_combined_memory():
  """Under pia, compressed slots take window positions too: compressive
  (compressed 6 + memory 4, rate 1, mean_pool) = XL with memory 10, both
  at positions 0 .. 9 for the memory and 10 .. 15 for the segment, over
  four segments (padding in some)."""
  xl = pia_block(memory_length=10)
  comp = pia_block(
    'compressive_transformer',
    memory_length=4,
    compressed_length=6,
    compression_rate=1,
    compression='mean_pool',
  )
  nnx.update(comp, nnx.state(xl, nnx.Param))
  x = jax.random.normal(jax.random.key(5), (B, 4 * C, 16))
  pad = jnp.concatenate([padding((C, C), C), padding((C, 3), C)] * 2, 1)
  want = recurrence([xl], x, pad)[0]
  got = recurrence([comp], x, pad)[0]
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5)


def test_memory_is_a_stop_gradient(xl_blocks):
  """The second segment depends on the first through the memory, but no
  gradient reaches the first segment's inputs."""
  x = jax.random.normal(jax.random.key(1), (B, 2 * C, 16))
  pad = jnp.ones((B, 2 * C), bool)

  def second(x1, x2):
    out = recurrence(xl_blocks[:1], jnp.concatenate([x1, x2], 1), pad)[-1]
    return out[:, C:]

  x1, x2 = x[:, :C], x[:, C:]
  g1, g2 = jax.jit(
    jax.grad(lambda a, b: jnp.sum(second(a, b) ** 2), argnums=(0, 1))
  )(x1, x2)
  assert np.all(np.asarray(g1) == 0.0)
  assert np.abs(np.asarray(g2)).sum() > 0
  other = jax.random.normal(jax.random.key(2), x1.shape)
  moved = jax.jit(second)(other, x2) - jax.jit(second)(x1, x2)
  assert np.abs(np.asarray(moved)).max() > 1e-3


# ------------------------------------------------------------ compressive
@pytest.mark.parametrize('compression', ['mean_pool', 'conv1d', 'most_used'])
def test_compressive_at_rate_1_equals_xl_with_the_combined_memory(compression):
  """Memory 4 + compressed 6 at rate 1 (the compression is then the
  identity; conv1d at its initialisation) = XL with memory 10, over four
  segments; the reconstruction loss is 0."""
  xl = core(memory_length=10)
  comp = core(
    'compressive_transformer',
    memory_length=4,
    compressed_length=6,
    compression_rate=1,
    compression=compression,
  )
  nnx.update(comp.rel, nnx.state(xl.rel))
  segs = segments(4, seed=10)
  want, _ = run_core(xl, segs)
  got, losses = run_core(comp, segs)
  for t, (g, w) in enumerate(zip(got, want)):
    np.testing.assert_allclose(g, w, atol=1e-5, err_msg=str(t))
  np.testing.assert_allclose(losses, 0.0, atol=1e-10)


@pytest.mark.parametrize(
  'compression', ['max_pool', 'mean_pool', 'conv1d', 'most_used']
)
def test_reconstruction_loss_is_positive_and_trains_only_the_compression(
  compression,
):
  """At rate 2 the compressed memory cannot reproduce the attention over
  what it replaces; the loss's gradient reaches the conv1d kernels only,
  never q, k, v (the main network)."""
  comp = core(  # m < C: the evicted slots include the current segment's
    'compressive_transformer',
    memory_length=2,
    compressed_length=C,
    compression_rate=2,
    compression=compression,
  )
  segs = segments(2, seed=20, lengths=((C,), (C - 1,)))
  memory = comp.initial_memory(B, C, jnp.float32)
  graphdef, params, rest = nnx.split(comp, nnx.Param, ...)

  def loss(params, q, k, v):
    c = nnx.merge(graphdef, params, rest)
    mem = memory
    total = 0.0
    for s, (_, _, _, pad) in enumerate(segs):
      qs, ks, vs = (q, k, v) if s else segs[0][:3]
      _, aux = c(qs, ks, vs, Mask(pad, False), memory=mem)
      mem, total = aux['memory'], total + aux['loss']
    return total

  q, k, v, _ = segs[1]
  value, grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3)))(
    params, q, k, v
  )
  assert value > 1e-4, value
  for g in grads[1:]:
    assert np.all(np.asarray(g) == 0.0)
  for path, g in jax.tree_util.tree_leaves_with_path(grads[0]):
    name = jax.tree_util.keystr(path)
    moved = np.abs(np.asarray(g)).sum() > 0
    assert moved == ('conv_k' in name or 'conv_v' in name), name


def pooled_oracle(x_BxOxHxD, valid_BxO, rate, how, kernel=None):
  """float64 f_c per group of `rate` slots over its valid slots only:
  (pooled [B, N, H, D], valid [B, N]); conv1d: rate / r * sum_j W_j x_j
  over the r valid slots j of the group."""
  x, valid = np.float64(x_BxOxHxD), np.asarray(valid_BxO)
  b, o, h, d = x.shape
  n = -(-o // rate)
  out, ok = np.zeros((b, n, h, d)), np.zeros((b, n), bool)
  for i in range(b):
    for g in range(n):
      slots = [
        j for j in range(g * rate, min(o, (g + 1) * rate)) if valid[i, j]
      ]
      if not slots:
        continue
      ok[i, g] = True
      xs = x[i, slots]
      if how == 'mean_pool':
        out[i, g] = xs.mean(0)
      elif how == 'max_pool':
        out[i, g] = xs.max(0)
      else:
        taps = [np.float64(kernel[j - g * rate]) for j in slots]
        y = sum(xj.reshape(-1) @ wj for xj, wj in zip(xs, taps))
        out[i, g] = (rate / len(slots) * y).reshape(h, d)
  return out, ok


@pytest.mark.parametrize('compression', ['max_pool', 'mean_pool', 'conv1d'])
def test_partly_padded_groups_pool_over_their_valid_slots(compression):
  """Rate 3 over 7 evicted slots (groups of 3, 3 and a tail of 1): the first
  example's groups have 3, 3 and 1 valid slots, the second's 1, 2 and 0.
  Each group's result is over its valid slots only (conv1d rescaled by
  c / r), against a float64 oracle; conv1d with a random kernel, and at its
  initialisation the mean of the valid slots, as mean_pool."""
  comp = core(
    'compressive_transformer', compression_rate=3, compression=compression
  )
  ks = jax.random.split(jax.random.key(40), 4)
  k = jax.random.normal(ks[0], (B, 7, H, D))
  v = jax.random.normal(ks[1], (B, 7, H, D))
  valid = jnp.array([[1, 1, 1, 1, 1, 1, 1], [1, 0, 0, 1, 0, 1, 0]], bool)
  if compression == 'conv1d':  # at init: the mean over the valid slots
    for got, x in zip(comp.compress(k, v, valid)[:2], (k, v)):
      want, _ = pooled_oracle(x, valid, 3, 'mean_pool')
      np.testing.assert_allclose(np.asarray(got), want, atol=1e-5)
    comp.conv_k[...] = 0.3 * jax.random.normal(ks[2], comp.conv_k[...].shape)
    comp.conv_v[...] = 0.3 * jax.random.normal(ks[3], comp.conv_v[...].shape)
  got_k, got_v, got_valid = comp.compress(k, v, valid)
  for got, x, kernel in (
    (got_k, k, getattr(comp, 'conv_k', None)),
    (got_v, v, getattr(comp, 'conv_v', None)),
  ):
    kernel = None if kernel is None else np.asarray(kernel[...])
    want, want_valid = pooled_oracle(x, valid, 3, compression, kernel)
    np.testing.assert_allclose(np.asarray(got), want, atol=1e-4)
    np.testing.assert_array_equal(np.asarray(got_valid), want_valid)
  np.testing.assert_array_equal(got_valid, [[1, 1, 1], [1, 1, 0]])


def test_aux_loss_reaches_the_training_loss_with_its_weight():
  """aux['loss'] scales with aux_loss_weight, and the train step's loss is
  cross-entropy + the encoder's aux loss (summed over layers, averaged over
  segments)."""
  segs = segments(3, seed=30)
  options = dict(memory_length=2, compressed_length=C, compression_rate=2)
  one = run_core(core('compressive_transformer', **options), segs)[1]
  weighted = run_core(
    core('compressive_transformer', aux_loss_weight=2.5, **options), segs
  )[1]
  assert one.sum() > 1e-5
  np.testing.assert_allclose(weighted, 2.5 * one, rtol=1e-5)

  task = tasks.get_task('listops')
  tokens = jax.random.randint(jax.random.key(0), (8, 64), 1, 16)
  batch = {
    'inputs': tokens.at[3, 30:].set(0),
    'labels': jnp.arange(8) % 10,
    'weights': jnp.ones((8,)),
  }
  c = smoke_config(
    'compressive_transformer', **{'model.attention.aux_loss_weight': 2.5}
  )
  graphdef, state = build.create_state(c, task, None)
  model, _ = nnx.merge(graphdef, state)
  logits, aux = jax.jit(lambda t: model(t))(batch['inputs'])
  m = steps.weighted_loss_and_metrics(logits, batch['labels'], batch['weights'])
  expected = m['loss_sum'] / m['count'] + aux['aux_loss']
  assert aux['aux_loss'] > 1e-5
  _, metrics = steps.make_train_step(graphdef)(state, batch, None)
  np.testing.assert_allclose(metrics['loss'], expected, rtol=1e-5)


def test_compressive_options_are_checked():
  with pytest.raises(UserError, match="Unknown compression 'zip'"):
    core('compressive_transformer', compression='zip')
  with pytest.raises(UserError, match='compression_rate must be an integer'):
    core('compressive_transformer', compression_rate=0)
  with pytest.raises(UserError, match='aux_loss_weight must be a number'):
    core('compressive_transformer', aux_loss_weight=-1.0)


# ---------------------------------------------------------------- encoder
def manual_encoder(enc, tokens_BxL):
  """SegmentRecurrentEncoder without its scan: a Python loop (mean
  pooling, no CLS)."""
  x = enc.embed.add_positions(enc.embed.embed(tokens_BxL))
  pad = tokens_BxL != 0
  s = enc.segment_length
  extra = -x.shape[1] % s
  x = jnp.pad(x, [(0, 0), (0, extra), (0, 0)])
  pad = jnp.pad(pad, [(0, 0), (0, extra)])
  b = x.shape[0]
  memories = [blk.attn.core.initial_memory(b, s, x.dtype) for blk in enc.blocks]
  outs = []
  for t in range(x.shape[1] // s):
    h = x[:, t * s : (t + 1) * s]
    for n, blk in enumerate(enc.blocks):
      h, aux = blk(h, Mask(pad[:, t * s : (t + 1) * s], False),
                   memory=memories[n])  # fmt: skip
      memories[n] = aux['memory']
    outs.append(h)
  out = jnp.concatenate(outs, 1)[:, : tokens_BxL.shape[1]]
  return enc.ln_final(out)


def tokens_with_padding(length, real=(37, 11), seed=0):
  t = jax.random.randint(jax.random.key(seed), (len(real), length), 1, 16)
  return jnp.where(jnp.arange(length)[None] < jnp.array(real)[:, None], t, 0)


def test_encoder_scan_equals_the_segment_loop():
  """The scan over segments (non-dividing: 40 tokens in segments of 16)
  equals the Python loop over them, padded outputs included."""
  c = smoke_config(**{'model.pooling': 'mean', 'model.num_layers': 2})
  model = build_model(c, tasks.get_task('listops'))
  assert isinstance(model.encoder, SegmentRecurrentEncoder)
  tokens = tokens_with_padding(40)
  got, pad, _ = jax.jit(lambda t: model.encoder(t))(tokens)
  want = jax.jit(lambda t: manual_encoder(model.encoder, t))(tokens)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5)
  np.testing.assert_array_equal(pad, tokens != 0)


def test_segment_padding_is_masked():
  """65 tokens (64 + CLS) in segments of 16 are padded to 80 and masked:
  the logits equal those of the same tokens padded to 79 (+ CLS = 80, five
  full segments); the second example (23 real tokens) has fully padded
  segments."""
  task = tasks.get_task('listops')
  logits = []
  tokens_64 = tokens_with_padding(64, real=(64, 23))
  for length in (64, 79):
    c = smoke_config(
      'compressive_transformer', max_length=length, **{'model.num_layers': 2}
    )
    model = build_model(c, task)
    tokens = jnp.pad(tokens_64, [(0, 0), (0, length - 64)])
    logits.append(np.asarray(jax.jit(lambda t: model(t)[0])(tokens)))
  np.testing.assert_allclose(logits[1], logits[0], atol=1e-5)


def test_cls_goes_after_the_last_real_token():
  c = smoke_config()
  model = build_model(c, tasks.get_task('listops'))
  enc = model.encoder
  enc.cls_E[...] = jnp.full_like(enc.cls_E[...], 7.0)
  tokens = tokens_with_padding(10, real=(4, 10, 0))
  x, real, at = enc.insert_cls(enc.embed.embed(tokens), tokens != 0)
  np.testing.assert_array_equal(at, [4, 10, 0])
  for b, p in enumerate([4, 10, 0]):
    np.testing.assert_array_equal(x[b, p], 7.0)
    np.testing.assert_array_equal(real[b], np.arange(11) <= p)


def test_builder_picks_the_encoder_by_the_recurrent_flag(monkeypatch):
  task = tasks.get_task('listops')
  assert isinstance(
    build_model(smoke_config('transformer'), task).encoder, Encoder
  )
  from models.attention.softmax import SoftmaxAttention

  monkeypatch.setattr(SoftmaxAttention, 'recurrent', True)
  model = build_model(smoke_config('transformer'), task)
  assert isinstance(model.encoder, SegmentRecurrentEncoder)


def test_memory_is_per_example_and_not_model_state():
  """No memory in the model's state (a checkpoint holds none) and none
  carried between calls: a batch gives the same logits alone and after
  another batch, so a resumed run equals an uninterrupted one."""
  model = build_model(smoke_config('compressive_transformer'),
                      tasks.get_task('listops'))  # fmt: skip
  everything = jax.tree.leaves(nnx.state(model))
  assert len(everything) == len(jax.tree.leaves(nnx.state(model, nnx.Param)))
  f = jax.jit(lambda t: model(t)[0])
  a, b = tokens_with_padding(64, seed=1), tokens_with_padding(64, seed=2)
  alone = np.asarray(f(b))
  f(a)
  np.testing.assert_array_equal(np.asarray(f(b)), alone)


def test_bad_encoder_settings_are_one_sentence():
  task = tasks.get_task('listops')
  with pytest.raises(UserError, match='model.segment_length must be'):
    build_model(smoke_config(**{'model.segment_length': 0}), task)
  with pytest.raises(UserError, match='Reversible blocks cannot carry'):
    build_model(smoke_config(**{'model.reversible': True}), task)
  with pytest.raises(UserError, match='memory_length must be an integer'):
    build_model(smoke_config(**{'model.attention.memory_length': -1}), task)


def test_training_step_memory_grows_linearly_in_segments():
  """Compiled train-step memory at fixed s = m = 128: 1K -> 4K tokens is
  4x the segments, and the peak grows by at most about 5x (measured 3.3;
  the exact transformer: 15.7). model.segment_remat keeps about one
  segment's activations: well under half the 4K peak (measured 0.11)."""
  task = tasks.get_task('listops')
  peaks = []
  for length, remat in ((1024, False), (4096, False), (4096, True)):
    c = smoke_config(
      max_length=length,
      batch_size=1,
      **{'model.segment_length': 128, 'model.segment_remat': remat},
    )
    graphdef, state = build.create_state(c, task, None)
    batch = {
      'inputs': jax.ShapeDtypeStruct((1, length), jnp.int32),
      'labels': jax.ShapeDtypeStruct((1,), jnp.int32),
      'weights': jax.ShapeDtypeStruct((1,), jnp.float32),
    }
    step = steps.make_train_step(graphdef)
    compiled = step.lower(state, batch, jax.random.key(0)).compile()
    peaks.append(compiled_memory(compiled)['peak'])
  assert peaks[1] / peaks[0] <= 5.0, peaks
  assert peaks[2] < 0.5 * peaks[1], peaks


@pytest.mark.slow
def test_killed_and_resumed_compressive_run_ends_like_uninterrupted(
  tmp_path, smoke_data_dir
):
  """train.py killed after step 4 and run again ends with the results of
  an uninterrupted run (the memory is recomputed per example)."""

  def run(workdir, *extra):
    return subprocess.run(
      [sys.executable, 'train.py',
       '--config=configs/listops.py:compressive_transformer,smoke',
       f'--workdir={workdir}', f'--config.data_dir={smoke_data_dir}', *extra],
      cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip

  full, killed = tmp_path / 'full', tmp_path / 'killed'
  assert run(full).returncode == 0
  assert run(killed, '--stop_after_steps=4').returncode == 3
  assert run(killed).returncode == 0
  a = (full / 'results.json').read_text()
  assert a == (killed / 'results.json').read_text()
