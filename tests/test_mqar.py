"""MQAR (lra/data/mqar.py), the per_position objective and model.short_conv.

The data: keys, values and labelled positions of both forms, the power law
of the query gaps (chi-square), determinism and disjoint splits; the
objective: only labelled positions count, causality through the whole
model with short_conv on; the convolution: causal by gradient, and
short_conv=0 exactly the model without it; a smoke run's results.json with
the extra test splits.
"""

import json
import os

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats
from test_models_tasks import task_config

from lra import data as tasks
from lra.data import cache, mqar
from lra.errors import UserError
from lra.train import batching, steps, validate
from models.attention import Mask
from models.classifier import build_model
from models.embeddings import Embedder
from models.layers import ShortConv
import train

SMALL = dict(vocab_size=64, seq_len=40, num_kv_pairs=4)


def drawn(rows=256, form='causal', seed=0, **kw):
  o = mqar.checked({**SMALL, 'form': form, **kw})
  rng = np.random.default_rng(seed)
  return o, mqar.draw(
    rng,
    rows,
    **{k: o[k] for k in ('vocab_size', 'seq_len', 'num_kv_pairs')},
    power_a=o['power_a'],
    form=form,
  )


@pytest.mark.parametrize('form', mqar.FORMS)
def test_each_query_asks_one_key_and_is_labelled_with_its_value(form):
  o, (inputs, labels, *_) = drawn(form=form)
  v, n = o['vocab_size'], o['num_kv_pairs']
  assert inputs.min() >= 1 and labels.shape == inputs.shape  # 0: padding
  for x, y in zip(inputs, labels):
    keys, values = x[0 : 2 * n : 2], x[1 : 2 * n : 2]
    assert ((keys >= 1) & (keys < v // 2)).all()
    assert ((values >= v // 2) & (values < v)).all()
    assert len(set(keys)) == n and len(set(values)) == n
    at = np.flatnonzero(y != mqar.IGNORE)
    assert len(at) == n and at.min() >= 2 * n  # never the pairs' positions
    query = at if form == 'causal' else at - 1
    assert ((query - 2 * n) % 2 == 0).all()  # query slots only
    assert sorted(x[query]) == sorted(keys)  # each key asked once
    if form == 'bidirectional':
      assert (x[at] == v).all()  # the mask id in each answer slot
      assert (x != v).sum() == len(x) - n
    else:
      assert (x < v).all()
    for q, t in zip(query, at):
      (i,) = np.flatnonzero(keys == x[q])  # exactly once among the keys
      assert y[t] == values[i]


def chi_square_p(samples, probabilities):
  """p-value of samples (ints) against probabilities, bins of expected
  count < 5 merged into their neighbour."""
  observed = np.bincount(samples, minlength=len(probabilities)).astype(float)
  expected = probabilities * len(samples)
  o_bins, e_bins, o_acc, e_acc = [], [], 0.0, 0.0
  for o_i, e_i in zip(observed, expected):
    o_acc, e_acc = o_acc + o_i, e_acc + e_i
    if e_acc >= 5:
      o_bins.append(o_acc)
      e_bins.append(e_acc)
      o_acc = e_acc = 0.0
  o_bins[-1] += o_acc
  e_bins[-1] += e_acc
  return stats.chisquare(o_bins, e_bins).pvalue


def test_query_gaps_follow_zoologys_power_law():
  """Pair 1's gap has P(g) ~ (g + 1)^(a - 1); pair 2's the successive-
  sampling marginal sum_i p_i p_j / (1 - p_i); uniform gaps are refused by
  the same test."""
  rows = 20_000
  o, (inputs, labels, keys, values, gaps) = drawn(rows=rows, power_a=0.01)
  space = (o['seq_len'] - 2 * o['num_kv_pairs']) // 2
  p = mqar.gap_probabilities(space, 0.01)
  assert p[0] > 5 * p[-1]  # heavy near small gaps
  # P(second = j) = sum_{i != j} p_i p_j / (1 - p_i)
  second = p * ((p / (1 - p)).sum() - p / (1 - p))
  np.testing.assert_allclose(second.sum(), 1.0)
  assert chi_square_p(gaps[:, 0], p) > 1e-3
  assert chi_square_p(gaps[:, 1], second) > 1e-3
  # The gaps are where the labels are (causal: at the query position).
  n = o['num_kv_pairs']
  want = np.sort(2 * n + 2 * gaps, axis=1)
  np.testing.assert_array_equal(
    np.sort(np.argwhere(labels != mqar.IGNORE)[:, 1].reshape(rows, n)), want
  )
  _, (*_, uniform) = drawn(rows=rows, power_a=1.0)
  assert chi_square_p(uniform[:, 0], p) < 1e-6
  assert chi_square_p(uniform[:, 0], np.full(space, 1 / space)) > 1e-3


def digests(x):
  return {row.tobytes() for row in np.asarray(x)}


def test_same_seed_same_arrays_and_splits_share_no_example():
  # A tiny space of examples (about 7,000), so that raw draws repeat.
  o = dict(vocab_size=8, seq_len=8, num_kv_pairs=2, num_train=2_000)
  o.update(num_val=200, num_test=200, test_splits='8:2,12:3')
  a, b = mqar.generate(o), mqar.generate(o)
  assert list(a) == ['train', 'val', 'test', 'test_8_2', 'test_12_3']
  for s in a:
    np.testing.assert_array_equal(a[s][0], b[s][0])
    np.testing.assert_array_equal(a[s][1], b[s][1])
  other = mqar.generate({**o, 'seed': 1})
  assert not np.array_equal(a['train'][0], other['train'][0])
  seen = set()
  for s, (x, y) in a.items():
    d = digests(x)
    assert len(d) == len(x), s  # distinct within the split
    assert not d & seen, s  # and from every split before it
    seen |= d
  shape = dict(vocab_size=8, seq_len=8, num_kv_pairs=2)
  raw = mqar.draw(
    np.random.default_rng(0), 2_000, **shape, power_a=0.01, form='causal'
  )[0]
  assert len(digests(raw)) < 2_000  # the check had duplicates to remove
  # An extra split does not depend on which other splits are listed.
  alone = mqar.generate({**o, 'test_splits': '12:3'})
  np.testing.assert_array_equal(alone['test_12_3'][0], a['test_12_3'][0])


def test_cache_holds_the_extra_splits_and_bad_options_are_one_sentence(
  tmp_path,
):
  task = tasks.get_task('mqar')
  options = {**SMALL, 'num_train': 64, 'num_val': 16, 'num_test': 16}
  options['test_splits'] = '20:2'
  path = task.ensure_prepared(str(tmp_path), options, False)
  assert os.path.basename(path) == mqar.cache_name(options)
  x, y = cache.load_split(path, 'train')
  assert x.shape == y.shape == (64, 40) and y.dtype == np.int32
  extra = task.load_extra_test_splits(str(tmp_path), options)
  assert list(extra) == ['20:2'] and extra['20:2'][0].shape == (16, 20)
  assert task.vocab_size_for(options) == 64 and task.causal_for(options)
  with open(os.path.join(path, 'info.json')) as f:
    assert json.load(f)['source'] == 'generated'
  for bad, match in [
    (dict(seq_len=41), 'must be even'),
    (dict(num_kv_pairs=11), 'at least 4 x num_kv_pairs'),
    (dict(vocab_size=8), 'fewer than the 4 distinct keys'),
    (dict(form='left'), 'form=left is not one of'),
    (dict(power_a=0), 'power_a=0 is out of range'),
    (dict(test_splits='64'), "'64' is not seq_len:num_kv_pairs"),
    (dict(test_splits='20:6'), 'entry 20:6'),
    (dict(colour=1), "Unknown mqar option 'colour'"),
  ]:
    with pytest.raises(UserError, match=match):
      task.cache_dir(str(tmp_path), {**SMALL, **bad})


def test_the_objective_must_fit_the_labels():
  config = task_config('mqar', 'transformer')
  validate.check_config(config)
  for key, value, match in [
    ('objective', 'classify', 'label per position'),
    ('length_schedule', '3:16', 'length_schedule'),
  ]:
    bad = task_config('mqar', 'transformer', **{key: value})
    with pytest.raises(UserError, match=match):
      validate.check_config(bad)
  listops = task_config('listops', 'transformer', objective='per_position')
  with pytest.raises(UserError, match='needs a task with a label per'):
    validate.check_config(listops)


def smoke_data(tmp_path, form='causal'):
  config = task_config('mqar', 'transformer', data_dir=str(tmp_path))
  config.data.form = form
  task = tasks.get_task('mqar')
  path = task.ensure_prepared(str(tmp_path), config.data.to_dict(), False)
  return config, task, cache.load_split(path, 'train')


def test_loss_and_accuracy_count_only_labelled_positions(tmp_path):
  config, task, (inputs, labels) = smoke_data(tmp_path)
  n = config.data.num_kv_pairs
  batch = batching.train_batch(
    inputs, labels, seed=0, step=0, global_batch=8, length=config.max_length
  )
  assert batch['labels'].shape == batch['weights'].shape == (8, 32)
  assert batching.IGNORE == mqar.IGNORE
  idx = batching.train_indices(0, 0, 8, len(labels))
  np.testing.assert_array_equal(
    batch['weights'], labels[np.sort(idx)] != mqar.IGNORE
  )
  assert batch['weights'].sum() == 8 * n
  model = build_model(config, task)
  logits = nnx.jit(lambda m, x: m(x)[0])(model, jnp.asarray(batch['inputs']))
  assert logits.shape == (8, 32, config.data.vocab_size)
  m = steps.weighted_loss_and_metrics(logits, batch['labels'], batch['weights'])
  assert m['count'] == 8 * n
  # Any labels at the unlabelled positions: the same loss and accuracy.
  changed = np.where(
    batch['weights'] > 0,
    batch['labels'],
    np.asarray(jnp.argmax(logits, -1)),  # "correct" there, if they counted
  )
  m2 = steps.weighted_loss_and_metrics(logits, changed, batch['weights'])
  for k in m:
    np.testing.assert_allclose(m2[k], m[k], rtol=1e-6)
  # Evaluation pads the last batch with rows of weight 0, never counted.
  batches = list(
    batching.eval_batches(inputs[:10], labels[:10], global_batch=8, length=32)
  )
  assert batches[1]['weights'][2:].sum() == 0
  assert sum(b['weights'].sum() for b in batches) == 10 * n
  # A shorter split padded to the model's length: padding labels IGNORE.
  (b,) = batching.eval_batches(
    inputs[:8, :16], labels[:8, :16], global_batch=8, length=32
  )
  assert (b['inputs'][:, 16:] == 0).all() and (b['weights'][:, 16:] == 0).all()


def input_gradients(model, tokens, ts, monkeypatch):
  """d sum(logits[:, t]^2) / d (token vectors), for each t in ts."""
  x = model.encoder.embed.embed(tokens)
  given = {}
  monkeypatch.setattr(Embedder, 'embed', lambda self, t: given['x'])

  def forward(x):
    given['x'] = x
    return model(tokens)[0]

  @jax.jit
  def gradients(x):
    logits, vjp = jax.vjp(forward, x)
    at = jnp.arange(logits.shape[1])
    return [vjp(2 * logits * (at == t)[None, :, None])[0] for t in ts]

  return [np.asarray(g) for g in gradients(x)]


@pytest.mark.parametrize('form', mqar.FORMS)
def test_causal_form_is_causal_through_the_whole_model(
  form, tmp_path, monkeypatch
):
  """With short_conv on (width 3, weights perturbed from the identity, so
  its past taps act): the causal form's logits at t have zero gradient
  after t; the bidirectional form's do not."""
  config, task, (inputs, _) = smoke_data(tmp_path, form)
  config.model.short_conv = 3
  model = build_model(config, task)
  assert model.encoder.causal == (form == 'causal')
  conv = model.encoder.blocks[0].short_conv
  conv.kernel_KxE[...] = conv.kernel_KxE[...] + 0.5
  tokens = jnp.asarray(inputs[:2], jnp.int32)
  ts = (0, 13, 30)
  for t, g in zip(ts, input_gradients(model, tokens, ts, monkeypatch)):
    assert np.abs(g[:, : t + 1]).sum() > 0, t
    if form == 'causal':
      assert (g[:, t + 1 :] == 0).all(), t
    else:
      assert np.abs(g[:, t + 1 :]).sum() > 0, t


def test_short_conv_is_causal_and_zeroes_padding_first():
  """Output t depends on inputs t-K+1 .. t exactly (by gradient); a padded
  input never reaches a real position."""
  k, length = 3, 12
  conv = ShortConv(4, k, dtype=jnp.float32)
  conv.kernel_KxE[...] = jax.random.normal(jax.random.key(0), (k, 4))
  x = np.random.default_rng(1).normal(size=(2, length, 4)).astype(np.float32)
  # Row t: d sum(y[:, t]) / d x, one vjp per output position.
  _, vjp = jax.vjp(lambda x: conv(x, Mask()), x)
  eye = jnp.eye(length)[:, None, :, None] * jnp.ones((1, 2, 1, 4))
  g_LxBxLxE = jax.jit(jax.vmap(lambda c: vjp(c)[0]))(eye)
  for t in range(length):
    seen = np.flatnonzero(np.abs(np.asarray(g_LxBxLxE[t])).sum((0, 2)))
    np.testing.assert_array_equal(seen, np.arange(max(0, t - k + 1), t + 1))
  real = jnp.arange(length)[None, :] != 4  # position 4 padded
  g = jax.jit(jax.grad(lambda x: conv(x, Mask(real))[:, 5:7].sum()))(x)
  assert (g[:, 4] == 0).all() and (g[:, 5] != 0).all()


def params_of(model):
  """{path: array} of the model's parameters."""
  pure = nnx.to_pure_dict(nnx.state(model, nnx.Param))
  return {
    jax.tree_util.keystr(path): np.asarray(value)
    for path, value in jax.tree_util.tree_leaves_with_path(pure)
  }


@pytest.mark.parametrize('block', ['transformer', 'ssm'])
def test_short_conv_zero_is_the_model_without_it(block):
  """short_conv=0 and a config made before the option build the same
  parameters and outputs; short_conv=2 adds exactly the convolution's, the
  others unchanged, and with its kernel set to the identity gives the
  outputs of the model without it (the convolution is the only change)."""

  def model_of(width):
    config = task_config('listops', 'transformer', **{'model.block': block})
    if width is None:  # a config made before the option
      with config.unlocked():
        del config.model['short_conv']
    else:
      config.model.short_conv = width
    return build_model(config, tasks.get_task('listops'))

  tokens = jnp.asarray(np.random.default_rng(0).integers(1, 16, (2, 64)))
  run = nnx.jit(lambda m, x: m(x)[0])
  old, off, on = model_of(None), model_of(0), model_of(2)
  assert params_of(old).keys() == params_of(off).keys()
  for key, value in params_of(old).items():
    np.testing.assert_array_equal(value, params_of(off)[key])
    np.testing.assert_array_equal(value, params_of(on)[key])
  added = sorted(set(params_of(on)) - set(params_of(old)))
  assert added == [
    "['encoder']['blocks'][0]['short_conv']['bias_E']",
    "['encoder']['blocks'][0]['short_conv']['kernel_KxE']",
  ]
  np.testing.assert_array_equal(run(old, tokens), run(off, tokens))
  assert not np.allclose(run(old, tokens), run(on, tokens), atol=1e-3)
  conv = on.encoder.blocks[0].short_conv
  conv.kernel_KxE[...] = jnp.zeros((2, 16)).at[0].set(1.0)
  np.testing.assert_allclose(run(old, tokens), run(on, tokens), atol=1e-6)
  with pytest.raises(UserError, match='short_conv must be an integer'):
    model_of(-1)


def test_short_conv_starts_as_the_scaled_sum_of_the_last_k_tokens():
  """Width 3: y_t = (x_t + x_{t-1} + x_{t-2}) / sqrt(3), zeros before the
  start, in every channel."""
  conv = ShortConv(6, 3, dtype=jnp.float32)
  x = np.random.default_rng(0).normal(size=(1, 5, 6)).astype(np.float32)
  y = np.asarray(conv(jnp.asarray(x), Mask()))
  padded = np.pad(x, ((0, 0), (2, 0), (0, 0)))
  want = (padded[:, 2:] + padded[:, 1:-1] + padded[:, :-2]) / np.sqrt(3)
  np.testing.assert_allclose(y, want, rtol=1e-6, atol=1e-6)


def test_smoke_run_reports_every_test_split(tmp_path):
  """In process: results.json has the main splits and, per extra test
  split, its accuracy over its queries (16:2 padded to the model's 32,
  64:8 by the model rebuilt at 64)."""
  config = task_config('mqar', 'transformer', data_dir=str(tmp_path))
  workdir = str(tmp_path / 'run')
  results = train.train_and_evaluate(config, workdir)
  with open(os.path.join(workdir, 'results.json')) as f:
    assert json.load(f) == json.loads(json.dumps(results))
  assert results['objective'] == 'per_position'
  assert results['test']['count'] == 64 * 4  # num_test x num_kv_pairs
  splits = results['test_splits']
  assert list(splits) == ['16:2', '64:8']
  assert splits['16:2']['count'] == 64 * 2
  assert splits['64:8']['count'] == 64 * 8
  for m in (results['test'], *splits.values()):
    assert 0 <= m['accuracy'] <= 1 and np.isfinite(m['loss'])
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    rows = [json.loads(line) for line in f]
  assert {r['split'] for r in rows} >= {'test_16:2', 'test_64:8'}


def test_zoology_preset_is_zoologys_block_at_small_sizes():
  """configs/mqar.py:<model>,zoology: the mixer alone per block, 4 pairs,
  Zoology's decay and no warm-up; positions and short_conv for attention
  cores only; another task refuses the preset in one sentence."""
  from configs import listops  # pylint: disable=g-import-not-at-top
  from configs import mqar as mqar_config  # pylint: disable=g-import-not-at-top

  small = mqar_config.get_config('transformer,small')
  for name, conv, positions in (
    ('transformer', 2, 'learned'),
    ('mamba', 0, 'none'),
  ):
    c = mqar_config.get_config(f'{name},zoology')
    assert c.preset == 'small,zoology'
    assert (c.model.block, c.model.short_conv, c.model.positions) == (
      'ssm',
      conv,
      positions,
    )
    assert (c.weight_decay, c.warmup_steps, c.data.num_kv_pairs) == (0.1, 0, 4)
    # small's sizes are kept
    assert (c.model.emb_dim, c.data.seq_len, c.data.vocab_size) == (
      small.model.emb_dim,
      small.data.seq_len,
      small.data.vocab_size,
    )
  assert mqar_config.get_config('mamba,small,zoology').to_dict() == (
    mqar_config.get_config('mamba,zoology').to_dict()
  )
  with pytest.raises(
    ValueError, match="Unknown preset 'zoology' for the listops task"
  ):
    listops.get_config('transformer,zoology')
