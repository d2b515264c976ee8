"""The LM objectives (lra/train/objectives.py, models/lm.py): masked_lm's masks and
counted positions, causal_lm's causality through the whole model and a
training run, the refusal of a core that cannot be causal, and every task
config traced with both objectives.

Causality per core (the output at t does not depend on inputs after t) is
tests/test_attention_suite.py::test_causal_by_gradient_or_refusal, and a
core registered without an entry there fails
test_every_core_is_in_the_suite: that is the test that fails when a new
causal-capable core is not covered.
"""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_models_tasks import task_config

from configs import base as base_config
from lra import data as tasks
from lra.errors import UserError
from lra.train import build, objectives, rundir, runtime, steps
from lra.train.metrics import read_rows
from models.classifier import build_model
from models.embeddings import Embedder
import train

V, PAD = 16, 0  # ListOps' vocabulary and padding id


def lm_config(objective, model='transformer', task='listops', **overrides):
  return task_config(task, model, objective=objective, **overrides)


def padded_batch(n=64, length=128, seed=0):
  """Tokens in [1, V) with trailing padding of random lengths."""
  rng = np.random.default_rng(seed)
  tokens = rng.integers(1, V, (n, length))
  lengths = rng.integers(length // 4, length + 1, n)
  tokens[np.arange(length)[None, :] >= lengths[:, None]] = PAD
  return {
    'inputs': tokens.astype(np.int32),
    'labels': np.zeros(n, np.int32),
    'weights': np.ones(n, np.float32),
  }


# train.py's key of a step (drawn inside the step): the dropout key, from
# which the step draws masked_lm's masks.
step_key = steps.step_key


def masked(batch, step=0, seed=0, mask_rate=0.15, sharding=None, key=None):
  """masked_lm's batch as the jitted step makes it (objectives.in_step),
  from the host batch; the batch placed by `sharding` when given."""
  config = lm_config('masked_lm', seed=seed, mask_rate=mask_rate)
  task = tasks.get_task('listops')
  host = objectives.lm_batch(batch, config, task)
  assert set(host) == {'inputs', 'weights'}  # plain token ids go over
  if sharding is not None:
    host = runtime.to_device(host, sharding)
  prepare = jax.jit(objectives.in_step(config, task))
  out = prepare(host, step_key(seed, step) if key is None else key)
  return {k: np.asarray(v) for k, v in out.items()}


def test_masked_lm_corrupts_80_10_10_and_counts_only_masked_positions():
  batch = padded_batch(n=256)
  lm = masked(batch)
  tokens, real = batch['inputs'], batch['inputs'] != PAD
  chosen = lm['weights'] > 0
  assert real.sum() > 15000  # enough tokens for the rates below
  np.testing.assert_array_equal(lm['labels'], tokens)
  assert not (chosen & ~real).any()  # padding never chosen
  assert abs(chosen.sum() / real.sum() - 0.15) < 0.015
  # Unchosen positions are unchanged; chosen: mask id, random, kept.
  np.testing.assert_array_equal(lm['inputs'][~chosen], tokens[~chosen])
  got = lm['inputs'][chosen]
  is_mask = got == objectives.mask_id(V)
  changed = ~is_mask & (got != tokens[chosen])
  assert abs(is_mask.mean() - 0.8) < 0.04
  # 10% random ids (a random id equals the original 1 in 15 times).
  assert abs(changed.mean() - 0.1 * 14 / 15) < 0.03
  assert ((got[~is_mask] >= 1) & (got[~is_mask] < V)).all()  # never pad
  # The loss counts the chosen positions only: logits elsewhere change
  # nothing.
  rng = np.random.default_rng(1)
  logits = rng.normal(size=tokens.shape + (V,)).astype(np.float32)
  other = np.where(chosen[..., None], logits, 100 * logits[::-1])
  a, b = (
    steps.weighted_loss_and_metrics(x, lm['labels'], lm['weights'])
    for x in (logits, other)
  )
  assert float(a['count']) == chosen.sum()
  np.testing.assert_allclose(a['loss_sum'], b['loss_sum'], rtol=1e-6)
  assert float(a['correct_sum']) == float(b['correct_sum'])


@pytest.mark.parametrize('rate', [0.05, 0.5, 1.0])
def test_masks_drawn_in_the_step_follow_mask_rate_and_skip_padding(rate):
  batch = padded_batch(n=256, seed=2)
  batch['weights'][-3:] = 0  # an evaluation's padded rows: never counted
  real = batch['inputs'] != PAD
  for step in (1, 7):
    chosen = masked(batch, step=step, mask_rate=rate)['weights'] > 0
    assert not (chosen & ~real).any()
    assert not chosen[-3:].any()
    counted = real[:-3]
    share = chosen[:-3].sum() / counted.sum()
    sigma = np.sqrt(rate * (1 - rate) / counted.sum())
    assert abs(share - rate) <= 5 * sigma + 1e-9, (rate, step, share)


def test_mask_is_a_function_of_seed_and_step_and_of_the_global_batch():
  batch = padded_batch(n=8, length=32)
  first, again = masked(batch, step=3), masked(batch, step=3)
  for k in first:
    np.testing.assert_array_equal(first[k], again[k])
  for step in (2, 4, 100):  # another step, other masks
    other = masked(batch, step=step)
    assert not np.array_equal(first['weights'], other['weights']), step
    assert not np.array_equal(first['inputs'], other['inputs']), step
  other_seed = masked(batch, step=3, seed=1)['weights']
  assert not np.array_equal(first['weights'], other_seed)
  # Drawn for the global batch inside jit: the batch sharded over the 4
  # devices (tests/conftest.py) gets the masks of one device.
  assert jax.device_count() == 4
  _, batch_sharding = runtime.make_mesh()
  sharded = masked(batch, step=3, sharding=batch_sharding)
  for k in first:
    np.testing.assert_array_equal(sharded[k], first[k])
  # Evaluation: a fixed key per (seed, batch number), not the step's.
  config = lm_config('masked_lm')
  keys = [objectives.eval_key(config, i) for i in (0, 0, 1)]
  evals = [masked(batch, key=k)['weights'] for k in keys]
  np.testing.assert_array_equal(evals[0], evals[1])
  assert not np.array_equal(evals[0], evals[2])
  assert objectives.eval_key(lm_config('causal_lm'), 0) is None


def test_masked_lm_steps_are_the_same_on_one_and_four_devices():
  """The train step with its masks on 1 device and sharded on 4."""
  config = lm_config('masked_lm')
  task = tasks.get_task('listops')
  host = objectives.lm_batch(padded_batch(n=8, length=64), config, task)
  prepare = objectives.in_step(config, task)
  out = []
  for devices in (jax.devices()[:1], jax.devices()):
    replicated, batch_sharding = runtime.make_mesh(devices)
    graphdef, state = build.create_state(config, task, replicated)
    step = steps.make_train_step(graphdef, prepare)
    batch = runtime.to_device(host, batch_sharding)
    _, metrics = step(state, batch, step_key(0, 1))
    sums = steps.make_eval_step(graphdef, prepare)(
      build.create_state(config, task, replicated)[1],
      batch,
      objectives.eval_key(config, 0),
    )
    out.append(jax.device_get((metrics, sums)))
  runtime.make_mesh()
  (m1, e1), (m4, e4) = out
  assert m1['count'] == m4['count'] > 0 and e1['count'] == e4['count'] > 0
  np.testing.assert_allclose(m1['loss'], m4['loss'], rtol=1e-5)
  np.testing.assert_allclose(e1['loss_sum'], e4['loss_sum'], rtol=1e-5)


def test_retrieval_pairs_are_two_documents_and_causal_targets_shift():
  pairs = np.arange(1, 2 * 2 * 6 + 1).reshape(2, 2, 6) % V
  pairs[1, 1, 4:] = PAD
  config = lm_config('causal_lm')
  task = tasks.get_task('retrieval')
  batch = {'inputs': pairs, 'labels': np.zeros(2), 'weights': np.ones(2)}
  lm = objectives.lm_batch(batch, config, task)
  docs = pairs.reshape(4, 6)
  np.testing.assert_array_equal(lm['inputs'], docs)
  np.testing.assert_array_equal(lm['labels'][:, :-1], docs[:, 1:])
  want = (docs[:, :-1] != PAD) & (docs[:, 1:] != PAD)
  np.testing.assert_array_equal(lm['weights'][:, :-1], want)
  assert (lm['weights'][:, -1] == 0).all() and lm['weights'][3, :3].all()


@pytest.mark.parametrize('tied', [True, False])
def test_causal_lm_logits_at_t_do_not_depend_on_later_tokens(tied, monkeypatch):
  """By gradient through the whole model (embeddings to head)."""
  config = lm_config('causal_lm', **{'model.tie_lm_head': tied})
  model = build_model(config, tasks.get_task('listops'))
  assert model.tied == tied
  tokens = jnp.asarray(padded_batch(n=2, length=64, seed=3)['inputs'])
  tokens = tokens.at[:, :40].set(jnp.maximum(tokens[:, :40], 1))
  x = model.encoder.embed.embed(tokens)
  given = {}  # the token vectors fed to the model in place of its lookup
  monkeypatch.setattr(Embedder, 'embed', lambda self, t: given['x'])

  ts = (0, 17, 39)

  def forward(x):
    given['x'] = x
    return model(tokens)[0]

  @jax.jit
  def gradients(x):
    """d sum(logits[:, t]^2) / d x for each t in ts, one vjp."""
    logits, vjp = jax.vjp(forward, x)
    at = jnp.arange(logits.shape[1])
    return [vjp(2 * logits * (at == t)[None, :, None])[0] for t in ts]

  for t, g in zip(ts, gradients(x)):
    g = np.asarray(g)
    assert (g[:, t + 1 :] == 0).all(), t
    assert np.abs(g[:, : t + 1]).sum() > 0, t


@pytest.mark.parametrize('model', ['transformer_xl', 'compressive_transformer'])
def test_causal_lm_through_the_segment_recurrent_encoder(model, monkeypatch):
  """The whole recurrent model (models/recurrent.py: 16-token segments, so
  t = 0, 17, 39 sit in segments 0, 1 and 2 after the CLS): by gradient,
  and, since the memory carried between segments is a stop-gradient, by
  changing every token after t, which leaves the logits up to t unchanged."""
  config = lm_config('causal_lm', model=model)
  assert config.model.segment_length == 16
  lm = build_model(config, tasks.get_task('listops'))
  assert lm.encoder.causal
  assert type(lm.encoder).__name__ == 'SegmentRecurrentEncoder'
  tokens = jnp.asarray(padded_batch(n=2, length=64, seed=4)['inputs'])
  tokens = tokens.at[:, :40].set(jnp.maximum(tokens[:, :40], 1))
  other = jnp.asarray(np.random.default_rng(5).integers(1, V, tokens.shape))
  ts = (0, 17, 39)
  laters = [jnp.where(jnp.arange(64) > t, other, tokens) for t in ts]
  lookup = lm.encoder.embed.tokens  # the table, before embed is replaced
  given = {}  # the token vectors fed to the model in place of its lookup
  monkeypatch.setattr(Embedder, 'embed', lambda self, t: given['x'])

  def forward(x, tokens):
    given['x'] = x
    return lm(tokens)[0]

  @jax.jit
  def check(x):
    """(logits, d sum(logits[:, t]^2) / d x per t, logits with the tokens
    after t changed per t)."""
    logits, vjp = jax.vjp(lambda x: forward(x, tokens), x)
    at = jnp.arange(logits.shape[1])
    grads = [vjp(2 * logits * (at == t)[None, :, None])[0] for t in ts]
    return logits, grads, [forward(lookup(b), b) for b in laters]

  logits, grads, changed = check(lookup(tokens))
  for t, g, got in zip(ts, grads, changed):
    g = np.asarray(g)
    assert (g[:, t + 1 :] == 0).all(), t
    assert np.abs(g[:, : t + 1]).sum() > 0, t
    np.testing.assert_allclose(got[:, : t + 1], logits[:, : t + 1], atol=1e-6)
    assert not np.allclose(got[:, t + 1 :], logits[:, t + 1 :]), t


def test_causal_lm_trains_on_listops_smoke(smoke_data_dir, tmp_path):
  config = lm_config('causal_lm', data_dir=smoke_data_dir)
  workdir = str(tmp_path / 'clm')
  results = train.train_and_evaluate(config, workdir)
  assert results['objective'] == 'causal_lm'
  for split in ('val', 'test', 'test_last'):
    m = results[split]
    assert 'accuracy' not in m and 0 <= m['token_accuracy'] <= 1
    np.testing.assert_allclose(m['perplexity'], np.exp(m['loss']))
  rows = read_rows(os.path.join(workdir, 'metrics.jsonl'))
  train_loss = [r['loss'] for r in rows if r['split'] == 'train']
  assert train_loss[-1] < train_loss[0]
  # The accuracy table has no row for a pretraining run.
  with open(os.path.join(workdir, 'results.json')) as f:
    assert json.load(f)['objective'] == 'causal_lm'
  from lra.report.tables import read_runs  # pylint: disable=g-import-not-at-top

  with pytest.raises(UserError, match='pretraining runs'):
    read_runs(str(tmp_path))
  # A run saved before these fields existed resumes when they keep their
  # defaults (here: tie_lm_head, mask_rate), not when one differs.
  path = os.path.join(workdir, 'config.json')
  with open(path) as f:
    saved = json.load(f)
  del saved['mask_rate'], saved['model']['tie_lm_head']
  with open(path, 'w') as f:
    json.dump(saved, f)
  defaults = base_config.get_base_config()
  assert rundir.check_resume(config, workdir, defaults) == {}
  del saved['objective']
  with open(path, 'w') as f:
    json.dump(saved, f)
  with pytest.raises(UserError, match='objective differ'):
    rundir.check_resume(config, workdir, defaults)


def test_a_core_that_cannot_be_causal_refuses_before_training(tmp_path):
  config = lm_config('causal_lm', model='linformer')
  with pytest.raises(UserError) as e:
    train.train_and_evaluate(config, str(tmp_path / 'lin'))
  assert str(e.value) == (
    "Attention core 'linformer' cannot be causal (its projections mix all "
    'positions); use another core for causal masks.'
  )
  assert not os.path.exists(tmp_path / 'lin')
  with pytest.raises(UserError, match='objective'):
    train.train_and_evaluate(lm_config('next_token'), str(tmp_path / 'bad'))
  with pytest.raises(UserError, match=r'mask_rate=1\.5 is out of range'):
    config = lm_config('masked_lm', mask_rate=1.5)
    train.train_and_evaluate(config, str(tmp_path / 'bad'))


TASKS = ('listops', 'text', 'retrieval', 'image', 'pathfinder', 'pathx')


@pytest.mark.parametrize('objective', objectives.LM_OBJECTIVES)
def test_every_task_config_traces_with_the_objective(objective):
  """The LM batch of each task (retrieval: 2B documents) through the
  compiled shapes of the train step."""
  for name in TASKS:
    config = lm_config(objective, task=name)
    task = tasks.get_task(name)
    graphdef, state = build.create_state(config, task, None)
    lead = (8, 2) if task.num_inputs == 2 else (8,)
    batch = {
      'inputs': np.ones(lead + (config.max_length,), np.int32),
      'labels': np.zeros(8, np.int32),
      'weights': np.ones(8, np.float32),
    }
    lm = objectives.lm_batch(batch, config, task)
    assert lm['inputs'].shape == (8 * task.num_inputs, config.max_length)
    step = steps.make_train_step(graphdef, objectives.in_step(config, task))
    _, metrics = jax.eval_shape(step, state, lm, jax.random.key(0))
    assert metrics['loss'].shape == (), name
