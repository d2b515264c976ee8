"""benchmark.py on tiny models, core memory growth, the LRA bubble chart;
--config cells, the modes, the derived rates and MFU, the per-cell deadline.

No timing assertions: speeds on a shared CPU say nothing.
"""

import json
import os
import subprocess
import sys

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_fidelity import write_run

from lra.bench import cells as bench_cells
from lra.bench import isolate as bench_isolate
from lra.bench import main as benchmark
from lra.bench import measure as bench_measure
from lra.bench import report as bench_report
from lra.errors import UserError
from lra.train import options as model_options
from models.attention import Mask, build
from models.attention.memory import core_memory, core_memory_bytes

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = ['transformer', 'transformer_fused']
LENGTHS = [64, 128]
SMOKE = 'configs/listops.py:transformer,smoke'


@pytest.fixture(scope='module')
def bench_dir(tmp_path_factory):
  out = str(tmp_path_factory.mktemp('bench'))
  benchmark.run_benchmark(
    MODELS,
    LENGTHS,
    out,
    preset='tiny',
    batch_size=max(2, jax.device_count()),
    num_steps=2,
    warmup=1,
  )
  return out


@pytest.mark.slow
def test_smoke_run_writes_table_json_and_plots(bench_dir):
  for name in ('benchmark.json', 'benchmark.md', 'speed.png', 'memory.png'):
    assert os.path.getsize(os.path.join(bench_dir, name)) > 0, name
  rows = bench_report.read_benchmark(bench_dir)
  assert [(r['model'], r['length']) for r in rows] == [
    (m, n) for m in MODELS for n in LENGTHS
  ]
  for row in rows:
    assert set(bench_cells.ROW_FIELDS) <= set(row), row['model']
    assert row['status'] == 'ok', row['error']
    assert row['peak_memory_source'] == 'xla_compiled_memory_analysis'
    assert row['peak_memory_bytes'] >= row['memory_analysis']['temp'] > 0
    assert row['steps_per_sec_min'] <= row['steps_per_sec']
    assert row['steps_per_sec'] <= row['steps_per_sec_max']
    assert row['flops_per_step'] > 0 and row['num_params'] > 0
    # The rates every cell gets; no peak FLOP/s is known for a CPU.
    assert row['mode'] == 'latency' and row['isolation'] == 'in_process'
    assert row['examples_per_sec'] == pytest.approx(
      row['steps_per_sec'] * row['batch_size']
    )
    assert row['tokens_per_sec'] == pytest.approx(
      row['examples_per_sec'] * row['length']
    )
    assert row['mfu'] is None and row['peak_flops_per_sec'] is None
  with open(os.path.join(bench_dir, 'benchmark.md')) as f:
    table = f.read()
  assert '| transformer | ' in table and '(1.0x)' in table
  # The setting beside the paper's: machine, preset, batch; ratios only.
  n = jax.device_count()
  assert f'Setup: {n} x cpu (cpu backend), preset tiny, batch {max(2, n)} ' in (
    table
  )
  assert 'over 16 TPU v3 chips' in table and '`--batch_size 2`' in table
  assert 'only the ratios to `transformer` do' in table


def test_table_marks_failed_cells_and_shows_paper_numbers():
  ok = dict.fromkeys(bench_cells.ROW_FIELDS)
  ok.update(
    model='transformer',
    length=1024,
    status='ok',
    steps_per_sec=2.0,
    peak_memory_bytes=2e9,
    batch_size=2,
    preset='cpu',
    timed_steps=5,
    warmup_steps=1,
    model_config=bench_cells.model_summary(
      bench_cells.text_config('transformer')
    ),
  )
  fast = {**ok, 'model': 'performer', 'steps_per_sec': 3.0, 'length': 1024}
  oom = {**ok, 'model': 'performer', 'length': 2048, 'status': 'OOM'}
  oom['error'] = 'OutOfMemory: needs 9 GB'
  text = bench_report.markdown([ok, fast, oom])
  assert '| performer | 3 (1.5x) | OOM |' in text
  assert '| *paper* | *9.5 (1.2x)* |' in text  # LRA Table 2, performer 1K
  assert 'performer at 2048: OOM' in text
  # A cell that failed before its config was read (no batch size) still
  # gets its table, not a TypeError.
  early = {**ok, 'status': 'error', 'batch_size': None, 'error': 'bad flag'}
  assert '| transformer | error |' in bench_report.markdown([early])


def test_failed_cells_are_marked_and_the_run_goes_on(tmp_path, monkeypatch):
  def measure(row, config, task, shardings, num_steps, warmup):
    if row['length'] == 128:
      raise RuntimeError('RESOURCE_EXHAUSTED: Out of memory allocating')
    raise ValueError('broken core')

  monkeypatch.setattr(bench_measure, 'measure', measure)
  rows = benchmark.run_benchmark(
    ['transformer'],
    LENGTHS,
    str(tmp_path),
    preset='tiny',
    batch_size=max(2, jax.device_count()),
    num_steps=1,
    warmup=0,
  )
  assert [r['status'] for r in rows] == ['error', 'OOM']
  assert rows[0]['error'] == 'ValueError: broken core'
  table = (tmp_path / 'benchmark.md').read_text()
  assert '| transformer | error | OOM |' in table
  assert (tmp_path / 'speed.png').exists()


def test_failure_classifies_out_of_memory():
  status, _ = bench_cells.failure(RuntimeError('RESOURCE_EXHAUSTED: 9GB'))
  assert status == 'OOM'
  status, message = bench_cells.failure(ValueError('bad shape'))
  assert (status, message) == ('error', 'ValueError: bad shape')


def test_models_flag_runs_exactly_the_listed_models():
  select = benchmark.select_models
  assert select('performer') == ['performer']
  assert select('performer', baselines=True) == MODELS + ['performer']
  assert select('transformer_fused', baselines=True) == MODELS
  assert select('performer,-transformer', baselines=True) == [
    'transformer_fused',
    'performer',
  ]
  everything = list(model_options.known_models())
  assert select('all,-transformer_fused', baselines=True) == [
    m for m in everything if m != 'transformer_fused'
  ]
  with pytest.raises(UserError, match='nope'):
    select('nope')


def test_models_transformer_runs_one_model_only(tmp_path):
  out = str(tmp_path / 'one')
  args = ['--preset=tiny', '--lengths=32', '--batch_size=4', '--steps=1']
  proc = subprocess.run(
    [
      sys.executable,
      'benchmark.py',
      '--models=transformer',
      *args,
      '--out',
      out,
    ],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert proc.returncode == 0, proc.stderr[-800:]
  rows = bench_report.read_benchmark(out)
  assert [(r['model'], r['status']) for r in rows] == [('transformer', 'ok')]


def test_table_says_when_there_is_no_exact_baseline(bench_dir):
  rows = [
    r
    for r in bench_report.read_benchmark(bench_dir)
    if r['model'] != 'transformer'
  ]
  table = bench_report.markdown(rows)
  assert 'the exact `transformer` was not measured in this run' in table
  line = [
    ln for ln in table.splitlines() if ln.startswith('| transformer_fused')
  ]
  assert line and 'x)' not in line[0]  # no ratio without the baseline
  with_base = bench_report.markdown(bench_report.read_benchmark(bench_dir))
  assert 'speed-up against `transformer`' in with_base


def test_command_line_error_is_one_sentence(tmp_path):
  proc = subprocess.run(
    [sys.executable, 'benchmark.py', '--models', 'nope', '--out', tmp_path],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert proc.returncode == 2
  assert proc.stderr.strip().startswith("error: Unknown model 'nope'")


def test_exact_softmax_core_memory_grows_quadratically():
  # The pattern for every core: sub-quadratic ones assert a ratio < 2.5.
  einsum = {'name': 'softmax', 'implementation': 'einsum'}
  ratio = core_memory_bytes(einsum, 256) / core_memory_bytes(einsum, 128)
  assert ratio > 3
  memory = core_memory(einsum, 128, causal=True, padding=False)
  assert memory['peak'] > memory['temp'] > 0


def _write_run(runs, name, task, model, accuracy, **overrides):
  """A run of the reference config (config.json + results.json)."""
  write_run(runs, name, task, model, accuracy, preset='', **overrides)


def test_bubble_chart_from_runs_and_benchmark(bench_dir, tmp_path):
  _write_run(tmp_path, 'a', 'text', 'transformer', 0.60)
  _write_run(tmp_path, 'b', 'listops', 'transformer', 0.30)
  _write_run(tmp_path, 'c', 'text', 'transformer_fused', 0.62)
  _write_run(tmp_path, 'd', 'text', 'performer', 0.65)  # not benchmarked
  # Another config of a benchmarked model: its own point, labelled.
  _write_run(tmp_path, 'e', 'text', 'transformer', 0.5, max_length=64)
  points, length, relative, label = bench_report.bubble_points(
    tmp_path, bench_dir
  )
  assert (length, relative) == (128, True)
  assert label == 'test accuracy (%), mean over text'  # the shared task
  by_model = {p[0]: p for p in points}
  assert set(by_model) == set(MODELS) | {'transformer [max_length=64]'}
  assert by_model['transformer'][1:3] == pytest.approx((60.0, 1.0))
  assert by_model['transformer [max_length=64]'][1:3] == pytest.approx(
    (50.0, 1.0)
  )
  assert by_model['transformer_fused'][4] == ('text',)
  path = bench_report.bubble_chart(tmp_path, bench_dir)
  assert path == os.path.join(bench_dir, 'lra_bubble.png')
  assert os.path.getsize(path) > 0
  with pytest.raises(UserError, match='benchmark.json'):
    bench_report.bubble_chart(tmp_path, tmp_path)


# ------------------------------------------------------------ --ceiling
def test_ceiling_row_is_measured_beside_the_models(tmp_path):
  rows = benchmark.run_benchmark(
    ['transformer'],
    [64],
    str(tmp_path),
    preset='tiny',
    batch_size=max(2, jax.device_count()),
    num_steps=1,
    warmup=0,
    ceiling=True,
  )
  assert [r['model'] for r in rows] == ['ceiling', 'transformer']
  top, base = rows
  assert top['status'] == 'ok', top['error']
  assert top['model_config']['attention'] == {'name': 'none'}
  # Same architecture and parameters, only the token mixing removed.
  assert top['num_params'] == base['num_params']
  assert top['peak_memory_bytes'] < base['peak_memory_bytes']
  assert top['flops_per_step'] < base['flops_per_step']
  table = (tmp_path / 'benchmark.md').read_text()
  assert '| ceiling | ' in table and 'Not an LRA model' in table
  assert '### Speed as a fraction of the ceiling' in table
  memory = table.split('### Memory as a multiple of the ceiling')[1]
  assert '| transformer | ' in memory and '| ceiling |' not in memory
  # Never trained, so never in the bubble chart (nor eval.py --table).
  _write_run(tmp_path / 'runs', 'a', 'text', 'transformer', 0.6)
  points, _, _, _ = bench_report.bubble_points(tmp_path / 'runs', tmp_path)
  assert [p[0] for p in points] == ['transformer']


def test_ceiling_tables_give_fractions():
  rows = []
  for model, speed, memory in (
    ('ceiling', 4.0, 1e9),
    ('transformer', 2.0, 2e9),
    ('performer', 3.0, 1.25e9),
  ):
    row = dict.fromkeys(bench_cells.ROW_FIELDS)
    row.update(
      model=model,
      length=1024,
      status='ok',
      steps_per_sec=speed,
      peak_memory_bytes=memory,
      batch_size=1,
      preset='paper',
      timed_steps=5,
      warmup_steps=1,
      model_config=bench_cells.model_summary(bench_cells.ceiling_config()),
    )
    rows.append(row)
  rows.append({**rows[2], 'length': 2048, 'status': 'OOM', 'error': 'OOM'})
  text = bench_report.markdown(rows)
  assert '| ceiling | 4 (2.0x) | - |' in text  # against the transformer
  speed, memory = text.split('### Speed as a fraction')[1].split('### Memory')
  assert '| transformer | 0.50 | - |' in speed
  assert '| performer | 0.75 | OOM |' in speed
  assert '| performer | 1.25x | OOM |' in memory
  assert '| transformer | 2.00x | - |' in memory
  # Without a ceiling row the report is as before.
  assert 'ceiling' not in bench_report.markdown(rows[1:3])


def test_ceiling_core_passes_real_values_through():
  core = build(
    {'name': 'none'},
    num_heads=2,
    head_dim=4,
    max_length=8,
    dropout_rate=0.1,
    dtype=jnp.float32,
    rngs=nnx.Rngs(0),
  )
  assert not jax.tree.leaves(nnx.state(core, nnx.Param))
  q, k, v = jax.random.normal(jax.random.key(0), (3, 2, 8, 2, 4))
  pad = jnp.arange(8)[None] < jnp.array([3, 0])[:, None]
  for causal in (False, True):
    out, aux = core(q, k, v, Mask(pad, causal), rngs=jax.random.key(1))
    assert aux == {}
    np.testing.assert_array_equal(out[0], v[0])  # padded rows too: v
    np.testing.assert_array_equal(out[1], 0.0)  # no visible key at all
  late = jnp.arange(8)[None] >= jnp.array([2, 9])[:, None]  # real from 2
  out, _ = core(q, k, v, Mask(late, True))
  np.testing.assert_array_equal(out[0, :2], 0.0)  # sees no key yet
  np.testing.assert_array_equal(out[0, 2:], v[0, 2:])
  assert core_memory_bytes({'name': 'none'}, 4096) <= 4096 * 2 * 16 * 4


def test_ceiling_flag_is_parsed(tmp_path):
  proc = subprocess.run(
    [
      sys.executable,
      'benchmark.py',
      '--ceiling',
      '--models',
      'nope',
      '--out',
      tmp_path,
    ],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert proc.returncode == 2, proc.stderr[-500:]
  assert proc.stderr.strip().startswith("error: Unknown model 'nope'")


def test_dtype_reaches_the_cell_and_the_kernel_is_detected_from_hlo():
  """--dtype sets each cell's compute dtype; fused_kernel_of reads the
  compiled HLO: no cuDNN call on this backend, 'cudnn' for a text that
  holds one."""
  c = bench_cells.cell_config('transformer_fused', 64, 'tiny', 2, 'bfloat16')
  assert c.dtype == 'bfloat16' and c.max_length == 64

  compiled = jax.jit(lambda x: x * 2).lower(jnp.ones(3)).compile()
  assert bench_measure.fused_kernel_of(compiled) is None

  class Fake:
    def as_text(self):
      return 'custom_call_target="__cudnn$fmhaSoftmax"'

  assert bench_measure.fused_kernel_of(Fake()) == 'cudnn'


# ------------------------------------------- --config, modes, deadlines
def test_config_cell_is_that_configs_step_in_throughput_mode(tmp_path):
  rows = benchmark.run_config_benchmark(
    [f'--config={SMOKE}'],
    str(tmp_path),
    num_steps=2,
    warmup=1,
    mode='throughput',
  )
  (row,) = rows
  assert row['status'] == 'ok', row['error']
  # The smoke config's own batch and length, its task and preset.
  assert (row['task'], row['model'], row['preset']) == (
    'listops',
    'transformer',
    'smoke',
  )
  assert (row['length'], row['batch_size'], row['mode']) == (
    64,
    8,
    'throughput',
  )
  assert row['config'] == f'--config={SMOKE}'
  # One wait at the end: a rate, no per-step spread.
  assert row['steps_per_sec'] > 0 and row['steps_per_sec_min'] is None
  assert row['examples_per_sec'] == pytest.approx(8 * row['steps_per_sec'])
  assert row['tokens_per_sec'] == pytest.approx(64 * row['examples_per_sec'])
  assert row['flops_per_step'] > 0
  assert row['mfu'] is None and row['peak_flops_source'] is None  # CPU
  assert row['model_config']['num_layers'] == 1
  on_disk = json.loads((tmp_path / 'benchmark.json').read_text())
  assert on_disk[0]['examples_per_sec'] == row['examples_per_sec']
  table = (tmp_path / 'benchmark.md').read_text()
  assert '### Throughput and model FLOP utilisation' in table
  assert '| transformer | listops | 64 | 8 | throughput | ' in table
  assert 'no peak known for this device' in table
  assert '*paper*' not in table  # Table 2's numbers are the Text cells'


def test_config_flag_runs_a_cell_in_its_own_process(tmp_path):
  """--config with an override on the command line: the cell's process
  re-parses the same flags (the default deadline isolates each cell)."""
  out = str(tmp_path / 'cfg')
  proc = subprocess.run(
    [
      sys.executable,
      'benchmark.py',
      f'--config={SMOKE}',
      '--config.model.mlp_dim=48',
      '--mode=throughput',
      '--steps=2',
      '--warmup=1',
      '--out',
      out,
    ],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert proc.returncode == 0, proc.stderr[-800:]
  (row,) = bench_report.read_benchmark(out)
  assert row['status'] == 'ok', row['error']
  assert row['isolation'] == 'process' and row['cell_timeout_s'] == 300
  assert row['model_config']['mlp_dim'] == 48  # the override reached it
  assert row['examples_per_sec'] > 0 and row['mfu'] is None
  assert os.path.getsize(os.path.join(out, 'cells', 'cell_000.log')) >= 0


def test_config_args_and_model_swap():
  argv = [
    '--out=x',
    '--config',
    'configs/listops.py:transformer,small',
    '--config.model.num_layers',
    '3',
    '--mode=loop',
  ]
  args = benchmark.config_args(argv)
  assert args == [
    '--config=configs/listops.py:transformer,small',
    '--config.model.num_layers=3',
  ]
  assert benchmark.model_of(args) == 'transformer'
  assert benchmark.with_model(args, 'transformer_fused') == [
    '--config=configs/listops.py:transformer_fused,small',
    '--config.model.num_layers=3',
  ]
  assert benchmark.with_model(['--config=configs/text.py'], 'local') == [
    '--config=configs/text.py:local'
  ]


def test_peak_table_and_mfu():
  peak = bench_measure.peak_flops
  assert peak('NVIDIA H200', 'bfloat16')[0] == 989e12
  assert peak('NVIDIA H200', 'float32')[0] == 67e12
  assert peak('NVIDIA H100 80GB HBM3', 'bfloat16')[0] == 989e12
  assert peak('NVIDIA H100 PCIe', 'bfloat16')[0] == 756e12
  assert peak('NVIDIA A100-SXM4-80GB', 'float32')[0] == 19.5e12
  assert peak('TPU v4', 'float32')[0] == 275e12  # bf16 passes on the MXU
  assert peak('TPU v5 lite', 'bfloat16')[0] == 197e12
  assert peak('TPU v5p', 'bfloat16')[0] == 459e12
  assert peak('cpu', 'float32') == (None, None)
  assert peak('cpu', 'float32', 2e12) == (2e12, '--peak_flops')
  assert 'datasheet' in peak('NVIDIA H200', 'bfloat16')[1]
  row = {'steps_per_sec': 4.0, 'flops_per_step': 1e12, 'device_kind': 'x'}
  config = bench_cells.cell_config('transformer', 128, 'tiny', 2)
  bench_measure.add_rates(
    row, config, bench_measure.tasks.get_task('text'), 16e12
  )
  assert row['mfu'] == pytest.approx(0.25)  # 4 x 1e12 / 16e12
  assert (row['examples_per_sec'], row['tokens_per_sec']) == (8.0, 1024.0)
  retrieval = bench_measure.tasks.get_task('retrieval')  # two documents
  bench_measure.add_rates(row, config, retrieval)
  assert row['tokens_per_example'] == 256 and row['mfu'] is None


def _fake_cell(code):
  return [sys.executable, '-c', code]


def test_deadline_records_a_timeout_and_the_next_cell_runs(
  tmp_path, monkeypatch
):
  """A cell past --cell_timeout_s is killed and recorded; the next cell
  runs; benchmark.json holds every finished cell before the next starts."""
  row = dict.fromkeys(bench_cells.ROW_FIELDS)
  row.update(
    model='transformer',
    length=64,
    status='ok',
    steps_per_sec=2.0,
    examples_per_sec=4.0,
    tokens_per_sec=256.0,
    peak_memory_bytes=1e6,
    batch_size=2,
    preset='tiny',
    mode='latency',
    timed_steps=1,
    warmup_steps=0,
    backend='cpu',
    device_kind='cpu',
    device_count=1,
    model_config=bench_cells.model_summary(
      bench_cells.text_config('transformer')
    ),
  )

  def cell_command(spec, row_path):
    if spec['length'] == 32:  # hangs
      return _fake_cell('import time; time.sleep(120)')
    # Copies what the run had written when this cell started, then
    # writes its row as a cell's process does.
    out = os.path.dirname(os.path.dirname(row_path))
    return _fake_cell(
      'import json, shutil, sys; '
      f'shutil.copy({os.path.join(out, "benchmark.json")!r}, '
      f'{os.path.join(out, "seen.json")!r}); '
      f'json.dump({row!r}, open({row_path!r}, "w"))'
    )

  monkeypatch.setattr(bench_isolate, 'cell_command', cell_command)
  rows = benchmark.run_benchmark(
    ['transformer'],
    [32, 64],
    str(tmp_path),
    preset='tiny',
    batch_size=2,
    num_steps=1,
    warmup=0,
    cell_timeout_s=3,
  )
  assert [r['status'] for r in rows] == ['timeout', 'ok']
  assert 'ran past --cell_timeout_s=3' in rows[0]['error']
  assert rows[0]['cell_seconds'] < 60  # killed, not waited for
  assert rows[0]['isolation'] == rows[1]['isolation'] == 'process'
  seen = json.loads((tmp_path / 'seen.json').read_text())
  assert [(r['length'], r['status']) for r in seen] == [(32, 'timeout')]
  table = (tmp_path / 'benchmark.md').read_text()
  assert '| transformer | timeout | 2 (1.0x) |' in table
  assert 'transformer at 32: timeout, ran past' in table


def test_a_cell_process_that_dies_is_an_error(tmp_path, monkeypatch):
  monkeypatch.setattr(
    bench_isolate,
    'cell_command',
    lambda spec, path: _fake_cell('import sys; print("boom"); sys.exit(3)'),
  )
  (row,) = benchmark.run_benchmark(
    ['transformer'],
    [32],
    str(tmp_path),
    preset='tiny',
    batch_size=2,
    num_steps=1,
    warmup=0,
    cell_timeout_s=30,
  )
  assert row['status'] == 'error'
  assert 'exited with status 3' in row['error'] and 'boom' in row['error']


def test_loop_rate_from_metrics_rows():
  rows = [
    {'step': 2, 'split': 'train', 'steps_per_sec': 50.0},  # 1-2: warm-up
    {'step': 4, 'split': 'train', 'steps_per_sec': 1.0},  # 2-4: warm-up
    {'step': 5, 'split': 'val', 'accuracy': 0.5},
    {'step': 6, 'split': 'train', 'steps_per_sec': 10.0},  # 4-6: 0.2 s
    {'step': 9, 'split': 'train', 'steps_per_sec': 3.0},  # 6-9: 1 s
  ]
  assert bench_measure.loop_rate(rows) == (5, pytest.approx(5 / 1.2))
  # Without enough rows to leave the warm-up out, all of them.
  assert bench_measure.loop_rate(rows[:2]) == (3, pytest.approx(3 / 2.02))
  assert bench_measure.loop_rate([{'step': 1, 'split': 'train'}]) == (0, None)
  config = bench_cells.cell_config('transformer', 64, 'tiny', 2)
  config.log_every_steps = 4
  config = bench_measure.loop_config(config, 5)
  assert config.num_train_steps == 13 == config.eval_every_steps  # 2 x 4 + 5
  assert config.checkpoint_every_steps == 13 and config.length_schedule == ''


def test_loop_mode_needs_a_config(tmp_path):
  proc = subprocess.run(
    [sys.executable, 'benchmark.py', '--mode=loop', '--out', tmp_path],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert proc.returncode == 2
  assert proc.stderr.strip().startswith("error: --mode=loop runs train.py's")


@pytest.mark.slow
def test_loop_mode_against_the_bare_step(tmp_path, smoke_data_dir):
  (row,) = benchmark.run_config_benchmark(
    [f'--config={SMOKE}', f'--config.data_dir={smoke_data_dir}'],
    str(tmp_path),
    num_steps=2,
    warmup=1,
    mode='loop',
  )
  assert row['status'] == 'ok', row['error']
  assert row['bare_steps_per_sec'] == row['steps_per_sec'] > 0
  # Smoke logs every 2 steps: 2 x 2 warm-up steps, then the 2 timed ones.
  assert row['loop_timed_steps'] == 2
  assert row['loop_over_bare'] == pytest.approx(
    row['loop_steps_per_sec'] / row['bare_steps_per_sec']
  )
  table = (tmp_path / 'benchmark.md').read_text()
  assert '### Training loop against the bare step' in table
