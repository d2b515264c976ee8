"""python -m lra.sweep: runs, skips, failures, Ctrl-C and resume, --dry_run.

One module fixture drives four sweeps of ListOps `smoke` into one folder
(three train.py runs in all, plus one that fails at once):
  1. transformer, local with --config.model.attention.block_size=50: the
     transformer has no such option and fails; local trains (50 is its
     default, so its config is the plain one);
  2. local, transformer, no override: local is skipped, the transformer is
     interrupted with SIGINT once it trains;
  3. the same command: the transformer resumes from its checkpoint;
  4. the same command: both are skipped.
The resumed transformer is compared with conftest's uninterrupted smoke run
of the same config.
"""

import functools
import json
import os
import select
import signal
import subprocess
import sys
import time
import types

import pytest

from lra.errors import UserError
from lra.sweep import main as sweep
from lra.sweep import plan as sweep_plan
from lra.sweep import runner as sweep_run
from lra.train import options as model_configs
from lra.train.metrics import read_rows

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The sweep's runs as its command line plans them (configs/' catalogue).
plan = functools.partial(sweep_plan.plan, catalogue=sweep.catalogue())
RESULT_KEYS = ('best_step', 'val_accuracy', 'test_accuracy', 'steps_done')


def sweep_command(*args):
  return [sys.executable, '-m', 'lra.sweep.main', *args]


def run_sweep(*args):
  return subprocess.run(
    sweep_command(*args),
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=600,
  )


def interrupt_sweep(*args, err_path):
  """Starts a sweep, sends it SIGINT once train.py shows its progress bar
  (its signal handler is set just after), returns (exit status, stdout)."""
  with open(err_path, 'w') as err:
    proc = subprocess.Popen(
      sweep_command(*args), cwd=ROOT, stdout=subprocess.PIPE, stderr=err
    )
    seen, deadline = b'', time.monotonic() + 300
    while b'train step' not in seen and time.monotonic() < deadline:
      ready, _, _ = select.select([proc.stdout], [], [], 1.0)
      chunk = os.read(proc.stdout.fileno(), 4096) if ready else b''
      if ready and not chunk:
        break
      seen += chunk
    assert b'train step' in seen, seen.decode(errors='replace')
    time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    rest, _ = proc.communicate(timeout=300)
  return proc.returncode, (seen + rest).decode(errors='replace')


def entries(out):
  with open(os.path.join(out, 'sweep.json')) as f:
    return {e['model']: e for e in json.load(f)['runs']}


def read(path):
  with open(path) as f:
    return f.read()


@pytest.fixture(scope='module')
def swept(tmp_path_factory, smoke_data_dir):
  out = str(tmp_path_factory.mktemp('sweep'))
  common = (
    '--tasks=listops',
    '--preset=smoke',
    f'--out={out}',
    f'--config.data_dir={smoke_data_dir}',
  )
  s = types.SimpleNamespace(out=out, common=common)
  s.first = run_sweep(
    *common,
    '--models=transformer,local',
    '--config.model.attention.block_size=50',
  )
  s.first_runs = entries(out)
  s.second_rc, s.second_out = interrupt_sweep(
    *common, '--models=local,transformer', err_path=f'{out}.err'
  )
  s.second_runs = entries(out)
  s.third = run_sweep(*common, '--models=local,transformer')
  s.third_runs = entries(out)
  s.third_table = read(os.path.join(out, 'table.md'))
  s.fourth = run_sweep(*common, '--models=local,transformer')
  s.fourth_runs = entries(out)
  return s


@pytest.mark.slow
def test_failure_is_recorded_and_the_sweep_goes_on(swept):
  assert swept.first.returncode == 1, swept.first.stderr[-2000:]
  runs = swept.first_runs
  failed, done = runs['transformer'], runs['local']
  assert failed['status'] == 'failed' and failed['exit_status'] == 2
  message = failed['message']
  assert message.startswith("error: softmax has no option 'block_size'")
  assert '--config.model.attention.block_size=50' in failed['command']
  assert done['status'] == 'done' and done['exit_status'] == 0
  with open(os.path.join(done['workdir'], 'results.json')) as f:
    results = json.load(f)
  assert done['test_accuracy'] == results['test']['accuracy']
  assert done['best_step'] == results['best_step']
  assert done['steps_done'] == done['num_train_steps'] == 6
  assert done['wall_seconds'] > 0 and done['steps_per_sec'] > 0
  assert done['workdir'] == os.path.join(swept.out, 'listops', 'local-smoke')
  lines = swept.first.stdout.splitlines()
  assert any(
    ln.startswith('[1/2] listops/transformer-smoke: failed in') for ln in lines
  )
  assert any(
    ln.startswith('[2/2] listops/local-smoke: done in') for ln in lines
  )


def test_interrupt_then_rerun_equals_an_uninterrupted_run(swept, smoke_run):
  # 2: SIGINT reaches train.py once: it saves a checkpoint and stops.
  assert swept.second_rc == 130, swept.second_out[-2000:]
  stopped = swept.second_runs['transformer']
  assert stopped['status'] == 'interrupted'
  assert 1 <= stopped['steps_done'] < 6
  assert stopped['message'].startswith('Interrupted; latest checkpoint')
  assert swept.second_runs['local']['status'] == 'skipped'
  # 3: the same command resumes it from that checkpoint.
  assert swept.third.returncode == 0, swept.third.stderr[-2000:]
  assert f'from step {stopped["steps_done"]}.' in swept.third.stdout
  resumed = swept.third_runs['transformer']
  assert resumed['status'] == 'done'
  reference = sweep_run.outcome(smoke_run)
  assert {k: resumed[k] for k in RESULT_KEYS} == {
    k: reference[k] for k in RESULT_KEYS
  }
  assert resumed['test_accuracy'] is not None
  assert resumed['wall_seconds'] > stopped['wall_seconds']
  for model in ('transformer', 'local'):
    workdir = os.path.join(swept.out, 'listops', f'{model}-smoke')
    assert os.path.exists(os.path.join(workdir, 'results.json'))
  rows = [ln for ln in swept.third_table.splitlines() if ln.startswith('| ')]
  assert any(ln.startswith('| transformer [smoke] |') for ln in rows)
  assert any(ln.startswith('| local [smoke] |') for ln in rows)


def test_second_invocation_skips_finished_runs(swept, tmp_path):
  assert swept.fourth.returncode == 0, swept.fourth.stderr[-2000:]
  assert 'running' not in swept.fourth.stdout
  assert swept.fourth.stdout.count('skipped, already finished') == 2
  for model in ('transformer', 'local'):
    before, after = swept.third_runs[model], swept.fourth_runs[model]
    assert after['status'] == 'skipped'
    assert {k: after[k] for k in RESULT_KEYS} == {
      k: before[k] for k in RESULT_KEYS
    }
    assert after['wall_seconds'] == before['wall_seconds']
  assert read(os.path.join(swept.out, 'table.md')) == swept.third_table
  rows = read(os.path.join(swept.out, 'runs.md')).splitlines()[2:]
  for model in ('transformer', 'local'):
    (row,) = [r for r in rows if f'| `{model}` |' in r]
    cells = [c.strip() for c in row.strip('|').split('|')]
    entry = swept.fourth_runs[model]
    assert cells[3] == 'done'
    assert cells[4] == f'{100 * entry["test_accuracy"]:.2f}%'
  # A dry run over it: both would be skipped; a third model has no rate.
  empty = tmp_path / 'benchmark.json'
  with open(empty, 'w') as f:
    f.write('[]')
  dry = run_sweep(
    *swept.common,
    '--models=local,transformer,linformer',
    '--dry_run',
    f'--bench={empty}',
    '--noprobe',  # a model not in the benchmark stays unknown
  )
  assert dry.returncode == 0, dry.stderr
  assert dry.stdout.count('finished, would be skipped') == 2
  assert 'linformer-smoke: 6 steps, time unknown (linformer is not in' in (
    dry.stdout
  )


def test_dry_run_estimates_from_a_benchmark(tmp_path):
  # Cells of the smoke model's own size: the scale factor is 1.
  cell = {
    'status': 'ok',
    'length': 64,
    'sequence_length': 65,
    'batch_size': 8,
    'model_config': {
      'num_layers': 1,
      'emb_dim': 16,
      'qkv_dim': 16,
      'mlp_dim': 32,
    },
  }
  bench = tmp_path / 'bench'
  bench.mkdir()
  (bench / 'benchmark.json').write_text(
    json.dumps(
      [
        {**cell, 'model': 'transformer', 'steps_per_sec': 10.0},
        {**cell, 'model': 'local', 'steps_per_sec': 20.0},
        {
          **cell,
          'model': 'local',
          'length': 4096,
          'sequence_length': 4097,
          'steps_per_sec': 0.5,
        },
        {**cell, 'model': 'linformer', 'status': 'OOM', 'steps_per_sec': None},
      ]
    )
  )
  out = tmp_path / 'sweep'
  proc = run_sweep(
    '--tasks=listops',
    '--models=transformer,local,linformer',
    '--preset=smoke',
    f'--out={out}',
    '--config.num_train_steps=600',
    '--dry_run',
    f'--bench={bench}',
    '--noprobe',
  )
  assert proc.returncode == 0, proc.stderr
  lines = proc.stdout.splitlines()
  commands = [ln.strip() for ln in lines if 'train.py' in ln]
  assert len(commands) == 3
  assert commands[1] == (
    'python train.py --config configs/listops.py:local,smoke --workdir '
    f'{out}/listops/local-smoke --config.num_train_steps=600'
  )
  assert lines[0] == '3 runs planned.'
  assert f'{bench}/benchmark.json' in lines[1]
  assert 'transformer-smoke: about 1m 00s (600 steps at 10 steps/s' in (
    proc.stdout
  )
  assert 'local-smoke: about 30s (600 steps at 20 steps/s' in proc.stdout
  assert 'linformer-smoke: 600 steps, time unknown (linformer is not in' in (
    proc.stdout
  )
  assert lines[-1] == 'Total: about 1m 30s for 2 runs (1 unknown).'
  assert not out.exists()


def test_unknown_names_are_one_sentence(tmp_path):
  proc = run_sweep('--tasks=listopz', '--models=all', f'--out={tmp_path}')
  assert proc.returncode == 2
  assert proc.stderr.strip().splitlines() == [
    "error: Unknown task 'listopz' in --tasks; valid: all, listops, text, "
    'retrieval, image, pathfinder, pathx, mqar.'
  ]
  with pytest.raises(UserError, match=r"'performr' in --models; valid: all, "):
    plan('listops', 'transformer,performr', 'small', 'x')
  with pytest.raises(UserError, match="'local,-local' leaves no model to run"):
    plan('listops', 'local,-local', 'small', 'x')
  with pytest.raises(UserError, match="preset 'big' in --preset; valid: none"):
    plan('listops', 'all', 'big', 'x')
  runs = plan('listops,pathfinder', 'all,-transformer_fused', '', 'o')
  assert len(runs) == 2 * (len(model_configs.known_models()) - 1)
  assert runs[0].workdir == os.path.join('o', 'listops', 'transformer')


def test_error_line():
  tail = 'val:  12%|#  | 1/8\r\nerror: Bad thing; fix it.\n\rtest: 0%|\n'
  assert sweep_run.error_line(tail, 2) == 'error: Bad thing; fix it.'
  assert sweep_run.error_line('train: 3/6\r', -9) == (
    'killed by SIGKILL (out of memory?)'
  )
  assert sweep_run.error_line('Traceback\n  x\nValueError: no\n', 1) == (
    'ValueError: no'
  )


def test_spt_preset_plans_the_pretraining_then_its_fine_tune():
  runs = plan(
    'listops',
    'transformer,local',
    'small_spt',
    'o',
    ('--config.objective=causal_lm', '--config.seed=3'),
  )
  assert [r.name for r in runs] == [
    'listops/transformer-small_spt',
    'listops/transformer-small_spt-ft',
    'listops/local-small_spt',
    'listops/local-small_spt-ft',
  ]
  assert runs[0].command() == (
    'python train.py --config configs/listops.py:transformer,small_spt '
    '--workdir o/listops/transformer-small_spt --config.objective=causal_lm '
    '--config.seed=3'
  )
  # The fine-tune classifies: the objective override is the pretraining's.
  assert runs[1].command() == (
    'python train.py --config configs/listops.py:transformer,small '
    '--workdir o/listops/transformer-small_spt-ft '
    '--config.init_from=o/listops/transformer-small_spt --config.seed=3'
  )
  spt = plan('text', 'transformer', 'spt', 'o')
  assert [r.config_arg.split(':')[1] for r in spt] == [
    'transformer,spt',
    'transformer',
  ]
  assert spt[1].workdir == os.path.join('o', 'text', 'transformer-spt-ft')
  with pytest.raises(UserError) as e:
    plan('listops', 'local', 'smoke_spt', 'o', ('--config.init_from=x',))
  assert str(e.value) == (
    "--preset smoke_spt sets each fine-tune's --config.init_from itself; "
    'drop --config.init_from=x (or use --preset smoke).'
  )


@pytest.mark.slow  # 17 s: two train.py runs; the plan is tested in CI above
def test_smoke_spt_sweep_pretrains_then_fine_tunes(tmp_path, smoke_data_dir):
  """masked_lm on ListOps smoke, then the fine-tune from its encoder: both
  in sweep.json (the pretraining with losses, no accuracy) and table.md."""
  out = str(tmp_path / 'spt')
  proc = run_sweep(
    '--tasks=listops',
    '--models=transformer',
    '--preset=smoke_spt',
    f'--out={out}',
    f'--config.data_dir={smoke_data_dir}',
  )
  assert proc.returncode == 0, proc.stderr[-2000:]
  with open(os.path.join(out, 'sweep.json')) as f:
    runs = {e['name']: e for e in json.load(f)['runs']}
  pre = runs['listops/transformer-smoke_spt']
  ft = runs['listops/transformer-smoke_spt-ft']
  with open(os.path.join(pre['workdir'], 'results.json')) as f:
    results = json.load(f)
  assert 'select' not in results
  assert pre['status'] == 'done' and pre['objective'] == 'masked_lm'
  assert pre['val_accuracy'] is None and pre['test_accuracy'] is None
  assert pre['val_loss'] == results['val']['loss']
  assert pre['test_loss'] == results['test']['loss']
  assert pre['test_token_accuracy'] == results['test']['token_accuracy']
  assert pre['test_perplexity'] is None  # masked_lm has none
  assert ft['status'] == 'done' and ft['objective'] == 'classify'
  assert 0 <= ft['test_accuracy'] <= 1
  assert ft['command'].endswith(
    f'listops.py:transformer,smoke --workdir {ft["workdir"]} '
    f'--config.init_from={pre["workdir"]} --config.data_dir={smoke_data_dir}'
  )
  rows = read_rows(os.path.join(ft['workdir'], 'metrics.jsonl'))
  assert rows[0]['init_from_step'] == pre['best_step']
  lines = proc.stdout.splitlines()
  assert lines[0].startswith('[1/2] listops/transformer-smoke_spt: running')
  assert any(
    ln.startswith('[1/2] listops/transformer-smoke_spt: done in')
    and 'masked_lm: best step' in ln
    for ln in lines
  )
  table = read(os.path.join(out, 'table.md')).splitlines()
  assert any(
    ln.startswith('| transformer [smoke, init_from=(smoke, spt)] |')
    for ln in table
  )
  assert any(
    ln.startswith('| listops | transformer [smoke, spt] | masked_lm |')
    for ln in table
  )


def test_jobs_run_side_by_side_and_prepare_the_data_once(tmp_path):
  """--jobs 2: both runs start before either ends, each writes its output
  to <workdir>/train.log, and the two trainings that find the data missing
  prepare it once (the other waits on the cache's lock)."""
  out, data = str(tmp_path / 'sweep'), str(tmp_path / 'data')
  proc = run_sweep(
    '--tasks=listops',
    '--preset=smoke',
    '--models=transformer,local',
    f'--out={out}',
    f'--config.data_dir={data}',
    '--jobs=2',
  )
  assert proc.returncode == 0, proc.stderr[-2000:]
  lines = proc.stdout.splitlines()
  started = [i for i, ln in enumerate(lines) if ': started (output: ' in ln]
  done = [i for i, ln in enumerate(lines) if ': done in ' in ln]
  assert len(started) == 2 and len(done) == 2, proc.stdout
  assert max(started) < min(done), proc.stdout
  runs = entries(out)
  for model in ('transformer', 'local'):
    assert runs[model]['status'] == 'done'
    log = read(os.path.join(runs[model]['workdir'], 'train.log'))
    assert 'Results:' in log or 'test' in log
  logs = [read(os.path.join(runs[m]['workdir'], 'train.log')) for m in runs]
  assert sum('Waiting for another process preparing' in g for g in logs) <= 1
  # The cache's lock file goes with its holder: the data folder keeps data.
  assert os.path.exists(os.path.join(data, 'listops'))
  assert not any(
    n.endswith('.lock') for n in os.listdir(os.path.join(data, 'listops'))
  )
