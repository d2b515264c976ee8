"""python -m experiments.locality.locality: the block sizes, the planned runs, bad flags,
and one real probe.

The probe (a module fixture) runs MQAR `smoke` at --blocks 2,32 (32 is
the whole sequence: one block) plus the transformer, each cut to 2 steps
without the extra test splits (three train.py runs, the test's cost), then
the same command again (every run skipped: nothing trains) and
--plot_only after the png and md are removed.
"""

import functools
import json
import os
import subprocess
import sys
import types

import pytest

from experiments.locality import locality
from lra.errors import UserError
from lra.sweep import main as sweep
from lra.sweep import plan as sweep_plan

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CATALOGUE = functools.lru_cache(maxsize=None)(sweep.catalogue)
# ml_collections loads a config file by importlib's load_module (run_config).
pytestmark = pytest.mark.filterwarnings(
  'ignore:the load_module:DeprecationWarning'
)


def probe(*args):
  return subprocess.run(
    [sys.executable, '-m', 'experiments.locality.locality', *args],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=600,
  )


def test_block_sizes():
  assert locality.block_sizes(200) == [2, 4, 8, 16, 32, 64, 128, 200]
  assert locality.block_sizes(201) == [2, 4, 8, 16, 32, 64, 128, 201]
  assert locality.block_sizes(128) == [2, 4, 8, 16, 32, 64, 128]
  assert locality.block_sizes(2) == [2]
  assert locality.block_sizes(1) == [1]
  assert locality.parse_blocks('32, 2,8,2', 65) == [2, 8, 32]
  assert locality.parse_blocks('1,65', 65) == [1, 65]


def test_the_length_the_attention_sees():
  listops = locality.local_config('listops', 'small', (), catalogue=CATALOGUE())
  assert locality.attended_length(listops) == (
    201,
    'max_length 200 + the CLS token',
  )
  mqar = locality.local_config('mqar', 'small', (), catalogue=CATALOGUE())
  assert locality.attended_length(mqar) == (64, 'max_length 64')


def test_planned_runs_are_local_per_block_then_the_transformer():
  runs = locality.probe_runs(
    'listops',
    'small',
    'o',
    ('--config.seed=1',),
    [2, 201],
    catalogue=CATALOGUE(),
  )
  assert [r.command() for r in runs] == [
    'python train.py --config configs/listops.py:local,small --workdir '
    'o/listops/local-small/model.attention.block_size=2 --config.seed=1 '
    '--config.model.attention.block_size=2',
    'python train.py --config configs/listops.py:local,small --workdir '
    'o/listops/local-small/model.attention.block_size=201 --config.seed=1 '
    '--config.model.attention.block_size=201',
    'python train.py --config configs/listops.py:transformer,small '
    '--workdir o/listops/transformer-small --config.seed=1',
  ]
  # The config a grid run is checked (and skipped when finished) against
  # is the one it trains: the block size included.
  config, problem = sweep_plan.run_config(runs[1])
  assert problem is None
  assert config.model.attention.block_size == 201 and config.seed == 1


def test_bad_flags_are_one_sentence():
  with pytest.raises(UserError) as e:
    locality.parse_blocks('2,300', 201, 'max_length 200 + the CLS token')
  assert str(e.value) == (
    "--blocks '2,300': '300' is not a block size from 1 to 201, the length "
    'the attention sees (max_length 200 + the CLS token); give integers '
    'joined by commas, e.g. --blocks 2,4,8,201.'
  )
  for spec in ('0', 'x', '', '2,,4', '-2', '2.5'):
    with pytest.raises(UserError, match='is not a block size from 1 to 64'):
      locality.parse_blocks(spec, 64)
  with pytest.raises(UserError, match=r'small_spt pretrains.*--preset small\.'):
    locality.check_flags('listops', 'small_spt', (), CATALOGUE())
  with pytest.raises(UserError, match='The probe sets model.attention.block'):
    locality.check_flags(
      'listops',
      'small',
      ('--config.model.attention.block_size=8',),
      CATALOGUE(),
    )
  with pytest.raises(UserError, match="Unknown task 'listops,text'"):
    locality.check_flags('listops,text', 'small', (), CATALOGUE())
  proc = probe('--task=mqar', '--preset=small', '--out=x', '--blocks=2,256')
  assert proc.returncode == 2
  assert proc.stderr.strip().splitlines() == [
    "error: --blocks '2,256': '256' is not a block size from 1 to 64, the "
    'length the attention sees (max_length 64); give integers joined by '
    'commas, e.g. --blocks 2,4,8,64.'
  ]


def test_markdown_of_unfinished_and_failed_runs(tmp_path):
  def entry(name, status, test=None, **grid):
    return {
      'name': name,
      'task': 'listops',
      'model': name.split('/')[1].split('-')[0],
      'preset': 'small',
      'workdir': str(tmp_path / name),
      'status': status,
      'test_accuracy': test,
      'val_accuracy': test,
      'wall_seconds': 75.0 if test else None,
      'grid': grid or None,
    }

  key = 'model.attention.block_size'
  runs = [
    entry('listops/transformer-small', 'done', 0.375),
    entry(f'listops/local-small/{key}=16', 'failed', **{key: '16'}),
    entry(f'listops/local-small/{key}=4', 'done', 0.2, **{key: '4'}),
    entry(f'listops/local-small/{key}=64', 'done', 0.37, **{key: '64'}),
    entry('listops/local-smoke/x', 'done', 0.9),  # another preset, no grid
  ]
  with open(tmp_path / 'sweep.json', 'w') as f:
    json.dump({'command': 'python -m lra.sweep ...', 'runs': runs}, f)
  png, md = (str(tmp_path / f'locality_listops.{x}') for x in ('png', 'md'))
  assert locality.write_probe(str(tmp_path), 'listops') == [png, md]
  text = open(md).read()
  assert 'python -m lra.sweep' not in text
  assert 'Chance: 10.00% (1 / 10 classes).' in text
  table = [ln for ln in text.splitlines() if ln.startswith('| ')]
  assert table == [
    '| block size | test | val | wall | status |',
    '| 4 | 20.00% | 20.00% | 1m 15s | done |',
    '| 16 | - | - | - | failed |',
    '| 64 | 37.00% | 37.00% | 1m 15s | done |',
    '| `transformer` | 37.50% | 37.50% | 1m 15s | done |',
  ]
  assert text.endswith(
    'Smallest block size within 1 point of the transformer (37.50%): 64.\n'
  )
  runs.append(entry(f'listops/local-smoke/{key}=4', 'failed', **{key: '4'}))
  runs[-1]['preset'] = 'smoke'
  with open(tmp_path / 'sweep.json', 'w') as f:
    json.dump({'runs': runs}, f)
  with pytest.raises(UserError, match='presets small, smoke; pick one'):
    locality.write_probe(str(tmp_path), 'listops')
  with pytest.raises(UserError, match='no locality probe of text'):
    locality.write_probe(str(tmp_path), 'text')


@pytest.fixture(scope='module')
def probed(tmp_path_factory):
  out = str(tmp_path_factory.mktemp('locality'))
  args = (
    '--task=mqar',
    '--preset=smoke',
    f'--out={out}',
    '--blocks=2,32',
    '--config.data.test_splits=',
    '--config.num_train_steps=2',
    '--config.eval_every_steps=2',
    '--config.checkpoint_every_steps=2',
  )
  s = types.SimpleNamespace(out=out)
  s.first = probe(*args)
  s.md = os.path.join(out, 'locality_mqar.md')
  s.png = os.path.join(out, 'locality_mqar.png')
  s.first_md = open(s.md).read() if os.path.exists(s.md) else ''
  with open(os.path.join(out, 'sweep.json')) as f:
    s.sweep = json.load(f)
  s.second = probe(*args)
  for path in (s.md, s.png):
    os.remove(path)
  s.plot_only = probe('--task=mqar', f'--out={out}', '--plot_only')
  return s


@pytest.mark.slow
def test_probe_trains_each_block_and_the_transformer(probed):
  assert probed.first.returncode == 0, probed.first.stderr[-3000:]
  runs = probed.sweep['runs']
  assert [r['name'] for r in runs] == [
    'mqar/local-smoke/model.attention.block_size=2',
    'mqar/local-smoke/model.attention.block_size=32',
    'mqar/transformer-smoke',
  ]
  assert [r['grid'] for r in runs] == [
    {'model.attention.block_size': '2'},
    {'model.attention.block_size': '32'},
    None,
  ]
  for r in runs:
    assert r['status'] == 'done' and r['steps_done'] == 2
    assert r['objective'] == 'per_position'
    assert 0 <= r['test_accuracy'] <= 1 and r['val_accuracy'] is not None
  assert probed.sweep['command'].startswith(
    'python -m experiments.locality.locality --task'
  )
  with open(probed.png, 'rb') as f:
    assert f.read(8) == b'\x89PNG\r\n\x1a\n'
  assert f'Locality: wrote {probed.png} and {probed.md}.' in (
    probed.first.stdout
  )
  # The table's rows are sweep.json's entries.
  rows = [
    [c.strip() for c in ln.strip('|').split('|')]
    for ln in probed.first_md.splitlines()
    if ln.startswith('| ') and not ln.startswith('| block size')
  ]
  labels = ['2', '32 (one block)', '`transformer`']
  assert [r[0] for r in rows] == labels
  for row, entry in zip(rows, runs):
    assert row[1] == f'{100 * entry["test_accuracy"]:.2f}%'
    assert row[2] == f'{100 * entry["val_accuracy"]:.2f}%'
    assert row[4] == 'done'
  assert 'Chance' not in probed.first_md  # per position: no chance level


def test_the_same_command_skips_every_run_and_plot_only_remakes(probed):
  assert probed.second.returncode == 0, probed.second.stderr[-3000:]
  assert 'running' not in probed.second.stdout
  assert probed.second.stdout.count('skipped, already finished') == 3
  assert probed.plot_only.returncode == 0, probed.plot_only.stderr
  assert os.path.exists(probed.png)
  assert open(probed.md).read() == probed.first_md
