"""Fidelity to the LRA reference: model selection, the accuracy table's
grouping by effective config, the data source, the Retrieval head and the
reference initialisers. The table tests write fake workdirs (config.json +
results.json); nothing here trains."""

import importlib
import json
import os

from flax import nnx
import jax.numpy as jnp
import numpy as np
import pytest

from configs import listops as listops_config
from configs import retrieval as retrieval_config
from configs import text as text_config
from lra import data as tasks
from lra.errors import UserError
from lra.report import tables as report
from lra.train import metrics
from models.classifier import build_model
from models.encoder import Encoder
import train


def write_run(
  root,
  name,
  task,
  model,
  accuracy,
  *,
  preset='smoke',
  last=None,
  seed=0,
  data_source='release',
  legacy=False,
  **overrides,
):
  """A finished run's files as train.py writes them: config.json from the
  task file (with `overrides`, dotted keys) and results.json; `legacy`: as
  written before test_last, select and data_source existed."""
  module = importlib.import_module(f'configs.{task}')
  config = module.get_config(','.join([model] + ([preset] if preset else [])))
  config.seed = seed
  config.update_from_flattened_dict(overrides)
  results = {
    'task': task,
    'model': model,
    'preset': config.preset,
    'best_step': 3,
    'val': {'accuracy': accuracy},
    'test': {'accuracy': accuracy},
  }
  saved = json.loads(config.to_json())
  if legacy:
    del saved['select']
  else:
    results.update(
      last_step=6,
      test_last={'accuracy': accuracy if last is None else last},
      select=metrics.selection(config),
      data_source=data_source,
    )
  os.makedirs(os.path.join(root, name))
  with open(os.path.join(root, name, 'config.json'), 'w') as f:
    json.dump(saved, f)
  with open(os.path.join(root, name, 'results.json'), 'w') as f:
    json.dump(results, f)


def table_row(table, label):
  """The Table 1 row of `label`."""
  rows = [ln for ln in table.splitlines() if ln.startswith(f'| {label} | ')]
  assert len(rows) == 1, (label, table)
  return rows[0]


def runs_rows(table, task):
  return [ln for ln in table.splitlines() if ln.startswith(f'| {task} | ')]


# ------------------------------------------------------- the table groups
def test_table_averages_seeds_and_labels_overridden_configs(tmp_path):
  write_run(tmp_path, 'a', 'listops', 'transformer', 0.30, seed=0)
  # Another seed; a bookkeeping field differs too: still the same config.
  write_run(
    tmp_path, 'b', 'listops', 'transformer', 0.40, seed=1, log_every_steps=1
  )
  write_run(
    tmp_path,
    'c',
    'listops',
    'transformer',
    0.90,
    **{'model.num_layers': 2, 'max_length': 32},
  )
  table = report.accuracy_table(str(tmp_path))
  # Smoke scale: marked so, and never beside the paper's numbers.
  assert table_row(table, 'transformer [smoke]').startswith(
    '| transformer [smoke] | smoke | 35.00 ±5.00 n=2 | - |'
  )
  row = table_row(table, 'transformer [smoke, max_length=32, num_layers=2]')
  assert '| smoke | 90.00 |' in row  # not averaged with the others
  assert '36.37' not in table
  assert sorted(r.split(' | ')[2:5] for r in runs_rows(table, 'listops')) == [
    ['1', '0', '90.00'],
    ['2', '0 1', '35.00 ±5.00'],
  ]
  runs = report.collect_runs(str(tmp_path))
  assert runs[('listops', 'transformer [smoke]')] == [30.0, 40.0]


def test_a_reference_config_run_has_the_plain_model_label(tmp_path):
  write_run(tmp_path, 'a', 'image', 'performer', 0.42, preset='')
  write_run(tmp_path, 'b', 'image', 'performer', 0.40, preset='', seed=3)
  table = report.accuracy_table(str(tmp_path))
  # Image's per-model architecture is part of its reference config: a
  # reference-scale row, beside the paper's numbers.
  assert (
    '| performer | reference | - (18.01) | - (65.40) | - (53.82) | '
    '41.00 ±1.00 n=2 (42.77) |' in table
  )
  assert runs_rows(table, 'image')[0].endswith('| reference | 42.77 |')


def test_only_reference_rows_sit_beside_the_paper(tmp_path):
  """A small run, and a reference-preset run with a changed value, are
  marked by their scale and get no paper number."""
  write_run(tmp_path, 'small', 'listops', 'transformer', 0.378, preset='small')
  write_run(
    tmp_path,
    'short',
    'listops',
    'transformer',
    0.2,
    preset='',
    num_train_steps=100,
  )
  write_run(tmp_path, 'ref', 'listops', 'transformer', 0.37, preset='')
  table = report.accuracy_table(str(tmp_path))
  assert table_row(table, 'transformer [small]').startswith(
    '| transformer [small] | small | 37.80 | - | - | - | - | - | - |'
  )
  assert table_row(table, 'transformer [num_train_steps=100]').startswith(
    '| transformer [num_train_steps=100] | reference, changed | 20.00 | - |'
  )
  assert table_row(table, 'transformer').startswith(
    '| transformer | reference | 37.00 (36.37) | - (64.27) |'
  )
  assert table.count('(36.37)') == 1
  scales = {
    r.split(' | ')[1]: r.split(' | ')[9:] for r in runs_rows(table, 'listops')
  }
  assert scales == {
    'transformer': ['reference', '36.37 |'],
    'transformer [num_train_steps=100]': ['reference, changed', '- |'],
    'transformer [small]': ['small', '- |'],
  }


def test_table_reports_the_selected_checkpoint_and_marks_it(tmp_path):
  # Validating on the test set (the reference's Text): the final step's.
  write_run(
    tmp_path,
    'ref',
    'text',
    'transformer',
    0.70,
    last=0.60,
    **{'data.val': 'test'},
  )
  write_run(tmp_path, 'held', 'text', 'transformer', 0.66, last=0.61)
  write_run(
    tmp_path, 'last', 'listops', 'transformer', 0.30, last=0.20, select='last'
  )
  table = report.accuracy_table(str(tmp_path))
  assert '| smoke | - | 60.00 ‡ |' in table_row(
    table, 'transformer [smoke, data.val=test]'
  )
  assert '| smoke | - | 66.00 |' in table_row(table, 'transformer [smoke]')
  assert '| smoke | 20.00 ‡ |' in table_row(
    table, 'transformer [smoke, select=last]'
  )
  text = {
    r.split(' | ')[1]: r.split(' | ')[4:8] for r in runs_rows(table, 'text')
  }
  assert text['transformer [smoke, data.val=test]'] == [
    '60.00',
    'last',
    '70.00',
    '60.00',
  ]
  assert text['transformer [smoke]'] == ['66.00', 'best_val', '66.00', '61.00']


def test_a_run_from_before_test_last_reports_its_best_validation(tmp_path):
  write_run(
    tmp_path,
    'old',
    'text',
    'transformer',
    0.5,
    legacy=True,
    **{'data.val': 'test'},
  )
  table = report.accuracy_table(str(tmp_path))
  row = runs_rows(table, 'text')[0].split(' | ')
  assert row[1:] == [
    'transformer [smoke, data.val=test]',
    '1',
    '0',
    '50.00',
    'best_val',
    '50.00',
    '-',
    'unknown',
    'smoke',
    '- |',
  ]


def test_generated_data_is_marked_and_never_pooled_with_release(tmp_path):
  write_run(
    tmp_path, 'g', 'pathfinder', 'transformer', 0.6, data_source='generated'
  )
  write_run(tmp_path, 'r', 'pathfinder', 'transformer', 0.8)
  table = report.accuracy_table(str(tmp_path))
  gen = table_row(table, 'transformer [smoke, data=generated, select=best_val]')
  assert gen.endswith('| smoke | - | - | - | - | 60.00 † | - | - |')
  rel = table_row(table, 'transformer [smoke, data=release, select=best_val]')
  assert rel.endswith('| smoke | - | - | - | - | 80.00 | - | - |')


def test_a_run_without_its_config_is_labelled_unknown(tmp_path):
  write_run(tmp_path, 'a', 'listops', 'transformer', 0.3)
  os.remove(tmp_path / 'a' / 'config.json')
  table = report.accuracy_table(str(tmp_path))
  assert table_row(table, 'transformer [smoke, config unknown]')


# ------------------------------------------------------- model selection
def test_selection_defaults_follow_the_validation_split():
  text = text_config.get_config('transformer')
  assert text.data.val == 'heldout' and metrics.selection(text) == 'best_val'
  text.data.val = 'test'
  assert metrics.selection(text) == 'last'
  listops = listops_config.get_config('transformer')
  assert metrics.selection(listops) == 'best_val'
  listops.select = 'last'
  assert metrics.selection(listops) == 'last'


def test_an_unknown_selection_is_refused_before_anything_is_written(
  tmp_path,
):
  config = listops_config.get_config('transformer,smoke')
  config.select = 'best'
  with pytest.raises(UserError, match=r'--config.select=best is not a model'):
    train.train_and_evaluate(config, str(tmp_path / 'run'))
  assert not os.path.exists(tmp_path / 'run')


# ------------------------------------------------------- retrieval head
@nnx.jit
def forward(module, tokens):
  return module(tokens)  # compiled: quicker than op by op


def _model(config, task_name):
  return build_model(config, tasks.get_task(task_name))


def test_dual_head_has_the_reference_layer_sizes():
  config = retrieval_config.get_config('transformer,smoke')
  e, mlp = config.model.emb_dim, config.model.mlp_dim
  model = _model(config, 'retrieval')
  head = model.head
  shapes = [head.hidden.kernel.shape, head.hidden2.kernel.shape]
  assert shapes + [head.logits.kernel.shape] == [
    (4 * e, mlp),
    (mlp, mlp // 2),
    (mlp // 2, 2),
  ]
  tokens = jnp.ones((2, 2, config.max_length), jnp.int32)
  assert forward(model, tokens)[0].shape == (2, 2)


@pytest.mark.parametrize('pooling', ['cls', 'first'])
def test_cls_token_or_first_token_pooling(pooling):
  """'cls' prepends a zero CLS at position 0 (a learned table of
  max_length + 1 rows); 'first' (the reference's dual encoder) prepends
  nothing and pools the first token."""
  config = retrieval_config.get_config('transformer,smoke')
  config.model.pooling = pooling
  config.model.positions = 'learned'
  model = _model(config, 'retrieval')
  encoder, length = model.encoder, config.max_length
  extra = int(pooling == 'cls')
  assert encoder.embed.pos_LxE.shape == (length + extra, config.model.emb_dim)
  assert hasattr(encoder, 'cls_E') == (pooling == 'cls')
  tokens = jnp.arange(1, 2 * length + 1).reshape(2, length) % 200 + 1
  x, padding, _ = forward(encoder, tokens)
  assert x.shape[1] == length + extra and padding.shape[1] == length + extra


# ------------------------------------------------- reference initialisers
def test_reference_initialisers_and_cls_at_position_zero():
  config = listops_config.get_config('transformer,smoke')
  config.model.positions = 'learned'
  model = _model(config, 'listops')
  block = model.encoder.blocks[0]
  for name in ('query', 'key', 'value', 'out'):
    linear = getattr(block.attn, name)
    assert linear.bias is None, name  # no bias, as the reference
    kernel = np.asarray(linear.kernel[...])
    bound = np.sqrt(6 / sum(kernel.shape))  # xavier_uniform
    assert 0.9 * bound < np.abs(kernel).max() <= bound, name
  for linear in (block.mlp.fc1, block.mlp.fc2):
    bias = np.asarray(linear.bias[...])
    assert 0 < np.abs(bias).max() < 1e-4  # normal(1e-6)
  cls = np.asarray(model.encoder.cls_E[...])
  assert cls.shape == (config.model.emb_dim,) and not cls.any()
  # Without blocks the encoder is LayerNorm(embedding + position): the CLS
  # (zeros) comes out as LayerNorm(position 0).
  config.model.num_layers = 0
  encoder = Encoder(
    config.model,
    vocab_size=16,
    max_length=config.max_length,
    pad_id=0,
    dtype=jnp.float32,
    rngs=nnx.Rngs(0),
  )
  tokens = jnp.ones((1, config.max_length), jnp.int32)
  x, _, _ = forward(encoder, tokens)
  pos = encoder.embed.pos_LxE[...]
  np.testing.assert_allclose(x[0, 0], encoder.ln_final(pos[0]), atol=1e-6)
  first = encoder.embed.embed(tokens)[0, 0] + pos[1]
  np.testing.assert_allclose(x[0, 1], encoder.ln_final(first), atol=1e-6)
