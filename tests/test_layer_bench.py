"""benchmark.py --layer (lra/bench/layer.py) on a tiny layer: rows with
both passes' times, memory and the ratios to transformer, and an error row
that does not stop the run. No timing assertions: speeds on a shared CPU
say nothing."""

import json
import os
import types

import pytest

from lra.bench import layer as layer_bench
from lra.errors import UserError

MODELS = ['transformer', 's4d', 'linear_transformer']
LENGTHS = [32, 64]


@pytest.fixture(scope='module')
def layer_dir(tmp_path_factory):
  out = str(tmp_path_factory.mktemp('layer'))
  rows = layer_bench.run_layer_bench(
    MODELS,
    LENGTHS,
    out,
    batch=1,
    heads=2,
    head_dim=8,
    rounds=1,
    # Impossible: linear_transformer has no such option.
    options={'linear_transformer': {'no_such_option': 1}},
    log=None,
  )
  return out, rows


def test_rows_have_times_memory_and_ratios(layer_dir):
  out, rows = layer_dir
  with open(os.path.join(out, 'layer.json')) as f:
    saved = json.load(f)
  assert saved == json.loads(json.dumps(rows))
  assert [(r['model'], r['length']) for r in saved] == [
    (m, n) for m in MODELS for n in LENGTHS
  ]
  ok = [r for r in saved if r['model'] != 'linear_transformer']
  for r in ok:
    assert set(layer_bench.ROW_FIELDS) <= set(r)
    assert r['status'] == 'ok', r['error']
    for name in ('fwd', 'fwd_bwd'):
      assert r[f'{name}_ms'] > 0 and len(r[f'{name}_ms_rounds']) == 1
      assert r[f'{name}_ms_min'] <= r[f'{name}_ms'] <= r[f'{name}_ms_max']
      assert r[f'{name}_temp_bytes'] == r[f'{name}_memory']['temp'] > 0
      assert r[f'{name}_speedup'] > 0
    assert r['memory_ratio'] > 0
  by = {(r['model'], r['length']): r for r in saved}
  base = by['transformer', 64]
  assert base['fwd_speedup'] == base['memory_ratio'] == 1.0
  assert base['kind'] == 'attention' and base['inputs'] == 'q,k,v [1,64,2,8]'
  assert base['attention']['implementation'] == 'einsum'
  mixer = by['s4d', 32]
  assert mixer['kind'] == 'mixer' and mixer['inputs'] == 'x [1,32,16]'
  assert mixer['num_params'] > 0
  assert mixer['memory_ratio'] == pytest.approx(
    mixer['fwd_bwd_temp_bytes'] / by['transformer', 32]['fwd_bwd_temp_bytes']
  )


def test_error_row_does_not_stop_the_run(layer_dir):
  out, rows = layer_dir
  bad = [r for r in rows if r['model'] == 'linear_transformer']
  assert [r['length'] for r in bad] == LENGTHS
  for r in bad:
    assert r['status'] == 'error'
    assert 'no_such_option' in r['error']
    assert r['fwd_ms'] is None and r['fwd_speedup'] is None
  with open(os.path.join(out, 'layer.md')) as f:
    table = f.read()
  assert '| s4d | 64 |' in table and '| linear_transformer | 32 | error |' in (
    table
  )
  assert 'Failures:' in table and 'no_such_option' in table


class FakeFlags:
  """The parsed flags check_flags reads: values, and which were given."""

  def __init__(self, **given):
    self.given = given
    self.layer = given.get('layer', False)
    self.config = None

  def __getitem__(self, name):
    return types.SimpleNamespace(present=name in self.given)


def test_flags_that_do_not_go_with_layer():
  layer_bench.check_flags(FakeFlags(layer=True, layer_rounds=2))
  with pytest.raises(UserError, match='--layer_batch'):
    layer_bench.check_flags(FakeFlags(layer=True, batch_size=4))
  with pytest.raises(UserError, match='add --layer'):
    layer_bench.check_flags(FakeFlags(layer_rounds=2))
  with pytest.raises(UserError, match='--layer_heads'):
    layer_bench.run_layer_bench(['transformer'], [8], 'unused', heads=0)
