r"""One accelerator session's checks, in priority order, within a budget.

  python -m experiments.device.devicecheck --out DIR [--budget_s 480] [--tiny]
      [--sections reference_throughput,fused_vs_einsum,...]

On whatever accelerator JAX finds (or the CPU), runs these cells in this
order until the budget is spent, rewriting DIR/devicecheck.json after every
cell:

  1. reference_throughput: the ListOps and Pathfinder reference configs'
     training throughput for the transformer (benchmark.py --config ...
     --mode throughput), einsum float32, einsum bfloat16 and fused
     (transformer_fused) bfloat16: steps/s, examples/s, tokens/s, MFU.
  2. fused_vs_einsum: transformer against transformer_fused at 1K, 2K, 3K
     and 4K on the Text paper width (benchmark.py --preset paper --dtype
     bfloat16), one cell per length; fused_over_einsum per length.
  3. all_models_4k: every registered model at 4K with the no-attention
     ceiling (benchmark.py --models all --ceiling --lengths 4096, each model
     in its own process with a deadline).
  4. listops_training: with the time left, the ListOps reference
     transformer trained to its 5,000 steps (train.py; the paper's test
     accuracy is 36.37%), started only when its expected time (from
     cell 1's measured ListOps steps/s) fits.

Every cell is a subprocess (benchmark.py or train.py; lra/ never imports
models/ or configs/) with its own timeout, min(the cell's cap, the time
left); its outputs (benchmark.json, results.json) are read back into the
report. A cell is started only when the time left covers its expected cost
(a static estimate scaled by how much slower than estimated the cells before
it ran); otherwise it is recorded as 'skipped' with the reason. A cell past
its timeout gets SIGINT (train.py then saves a checkpoint; benchmark.py
stops its current cell), then SIGKILL, and is recorded as 'timeout' with the
rows it wrote. all_models_4k may be cut by the budget this way: its rows
come in order (ceiling, transformer, transformer_fused, ...) and each one
written is kept. The training cell resumes from its checkpoint when run
again with the same --out.

--tiny shrinks everything (smoke configs, lengths 64-128, 1-2 steps, two
models for cell 3, the ListOps smoke run for cell 4) so the whole check runs
on a CPU in well under a minute. Cell logs are in DIR/logs/.
"""

import argparse
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import time

from lra.errors import UserError
from lra.report.paper import paper, paper_value
from lra.train import child
from lra.train.metrics import write_json

# The programs a cell runs (python -m): benchmark.py's and train.py's bodies.
PROGRAMS = {'benchmark': 'lra.bench.main', 'train': 'lra.train.main'}
REPORT = 'devicecheck.json'
SECTIONS = (
  'reference_throughput',
  'fused_vs_einsum',
  'all_models_4k',
  'listops_training',
)
TITLES = {
  'reference_throughput': 'ListOps and Pathfinder reference configs, '
  'transformer training throughput: einsum f32, einsum bf16, fused bf16',
  'fused_vs_einsum': 'transformer (einsum) against transformer_fused, Text '
  'paper width, bfloat16, 1K-4K',
  'all_models_4k': 'every registered model at 4K with the ceiling',
  'listops_training': 'ListOps reference transformer trained to its 5,000 '
  'steps (paper: 36.37% test)',
}
# The variants of cell 1: (name, model, dtype).
VARIANTS = (
  ('einsum_f32', 'transformer', 'float32'),
  ('einsum_bf16', 'transformer', 'bfloat16'),
  ('fused_bf16', 'transformer_fused', 'bfloat16'),
)
# Seconds a signalled cell gets to stop before SIGKILL, and the margin
# kept after that for the kill and the last JSON write (the budget holds).
GRACE_S = {False: 15.0, True: 5.0}
MARGIN_S = 1.0
# A benchmark row's fields kept in devicecheck.json (the full rows are in
# each cell's benchmark.json).
ROW_SUMMARY = (
  'model',
  'task',
  'length',
  'batch_size',
  'mode',
  'status',
  'error',
  'steps_per_sec',
  'examples_per_sec',
  'tokens_per_sec',
  'flops_per_step',
  'mfu',
  'peak_flops_source',
  'peak_memory_bytes',
  'device_peak_bytes_in_use',
  'compile_seconds',
  'fused_attention_kernel',
)


# ----------------------------------------------------------------- plan
def _cell(section, name, kind, args, expected_s, max_s, out=None):
  """One planned cell: a benchmark.py or train.py command line (args
  after `python -m PROGRAMS[kind]`)."""
  return {
    'section': section,
    'name': name,
    'kind': kind,
    'args': args,
    'expected_s': float(expected_s),
    'max_s': float(max_s),
    'out': out,
  }


def plan(out, tiny=False, sections=SECTIONS):
  """The cells, in priority order. `out`: where their outputs go."""
  steps = ['--steps=2', '--warmup=1'] if tiny else ['--steps=20', '--warmup=3']
  # --tiny's Text cells: batch 8 divides any CPU device count up to 8.
  text_batch = ['--batch_size=8'] if tiny else []
  cells = []

  def bench(section, name, args, expected_s, max_s):
    where = os.path.join(out, section, name)
    cells.append(
      _cell(
        section,
        name,
        'benchmark',
        [*args, f'--out={where}'],
        expected_s,
        max_s,
        where,
      )
    )

  for task in ('listops', 'pathfinder'):
    for variant, model, dtype in VARIANTS:
      if tiny and task == 'pathfinder' and variant != 'einsum_f32':
        continue  # --tiny: one Pathfinder variant
      preset = ',smoke' if tiny else ''
      bench(
        'reference_throughput',
        f'{task}_{variant}',
        [
          f'--config=configs/{task}.py:{model}{preset}',
          f'--config.dtype={dtype}',
          '--mode=throughput',
          '--cell_timeout_s=0',
          *steps,
        ],
        8 if tiny else 45,
        150 if tiny else 180,
      )
  for length in (64,) if tiny else (1024, 2048, 3072, 4096):
    bench(
      'fused_vs_einsum',
      f'text_{length}',
      [
        '--preset=tiny' if tiny else '--preset=paper',
        '--dtype=bfloat16',
        '--models=transformer,transformer_fused',
        f'--lengths={length}',
        '--cell_timeout_s=0',
        *steps,
        *text_batch,
      ],
      10 if tiny else 30 + 10 * length // 1024,
      150 if tiny else 240,
    )
  bench(
    'all_models_4k',
    'text_4096' if not tiny else 'text_64',
    [
      '--preset=tiny' if tiny else '--preset=paper',
      '--models=transformer,local' if tiny else '--models=all',
      '--ceiling',
      '--lengths=64' if tiny else '--lengths=4096',
      # --tiny: in its process; else a process and a deadline per model.
      '--cell_timeout_s=0' if tiny else '--cell_timeout_s=150',
      *steps,
      *text_batch,
    ],
    # What its first rows (ceiling, transformer, transformer_fused) cost;
    # the rest come as the budget allows.
    10 if tiny else 90,
    150 if tiny else 1800,
  )
  workdir = os.path.join(out, 'listops_training', 'transformer')
  cells.append(
    _cell(
      'listops_training',
      'transformer_smoke' if tiny else 'transformer',
      'train',
      [
        '--config=configs/listops.py:transformer' + (',smoke' if tiny else ''),
        f'--workdir={workdir}',
      ],
      10 if tiny else 600,
      150 if tiny else 3600,
      workdir,
    )
  )
  return [c for c in cells if c['section'] in sections]


# ------------------------------------------------------------------ run
def run_command(args, log_path, timeout_s, grace_s):
  """(returncode, seconds, timed_out) of `python -m args...` (a module and
  its arguments; lra/train/child.py), its output in log_path; past
  timeout_s it gets SIGINT, then SIGKILL after grace_s (its own process
  group, nothing else)."""
  start = time.perf_counter()
  with open(log_path, 'w') as log:
    proc = subprocess.Popen(
      child.command(*args),
      env=child.env(),
      stdout=log,
      stderr=subprocess.STDOUT,
      start_new_session=True,
    )
    timed_out = False
    try:
      proc.wait(timeout=max(timeout_s, 0.1))
    except subprocess.TimeoutExpired:
      timed_out = True
      _signal(proc, signal.SIGINT)
      try:
        proc.wait(timeout=grace_s)
      except subprocess.TimeoutExpired:
        _signal(proc, signal.SIGKILL)
        proc.wait()
    except BaseException:
      _signal(proc, signal.SIGKILL)
      proc.wait()
      raise
  return proc.returncode, time.perf_counter() - start, timed_out


def _signal(proc, sig):
  try:
    os.killpg(proc.pid, sig)
  except (ProcessLookupError, PermissionError):
    pass


def _tail(path, n=5):
  try:
    with open(path, errors='replace') as f:
      lines = [ln.rstrip() for ln in f.read().splitlines() if ln.strip()]
  except OSError:
    return []
  return [ln[-300:] for ln in lines[-n:]]


def read_benchmark_rows(where):
  """The summary of where/benchmark.json's rows ([] when there is none)."""
  try:
    with open(os.path.join(where, 'benchmark.json')) as f:
      rows = json.load(f)
  except (OSError, ValueError):
    return []
  out = []
  for row in rows:
    summary = {k: row.get(k) for k in ROW_SUMMARY}
    summary['dtype'] = (row.get('model_config') or {}).get('dtype')
    out.append(summary)
  return out


def device_of(where):
  """backend, device kind and count, versions of where/benchmark.json's
  first row that has them (None when there is none)."""
  try:
    with open(os.path.join(where, 'benchmark.json')) as f:
      rows = json.load(f)
  except (OSError, ValueError):
    return None
  keys = ('backend', 'device_kind', 'device_count', 'jax_version')
  for row in rows:
    if row.get('backend'):
      return {k: row.get(k) for k in (*keys, 'flax_version')}
  return None


def fused_over_einsum(rows):
  """transformer_fused's steps/s over transformer's (None unless both ran)."""
  speed = {r['model']: r['steps_per_sec'] for r in rows if r['status'] == 'ok'}
  einsum, fused = speed.get('transformer'), speed.get('transformer_fused')
  return fused / einsum if einsum and fused else None


def read_training(workdir):
  """results.json's test accuracies beside the paper's, or the last train
  row of metrics.jsonl when the run did not finish."""
  out = {
    'paper_test_accuracy': paper_value(
      paper()['table1_accuracy'], 'transformer', 'listops'
    )
  }
  try:
    with open(os.path.join(workdir, 'results.json')) as f:
      results = json.load(f)
  except (OSError, ValueError):
    results = None
  if results:
    out.update(
      test_accuracy=100 * results['test']['accuracy'],
      test_last_accuracy=100 * results['test_last']['accuracy'],
      best_step=results['best_step'],
      last_step=results['last_step'],
    )
    return out
  try:
    with open(os.path.join(workdir, 'metrics.jsonl')) as f:
      rows = [json.loads(ln) for ln in f if ln.strip()]
  except (OSError, ValueError):
    rows = []
  train = [r for r in rows if r.get('split') == 'train']
  if train:
    out['last_train_row'] = train[-1]
  return out


def training_estimate(report, tiny):
  """Expected seconds of the ListOps training cell: its 5,000 steps at
  cell 1's measured ListOps float32 steps/s, with a margin for the loop,
  data generation and the evaluations; None when that was not measured."""
  if tiny:
    return None
  for cell in (
    report['sections'].get('reference_throughput', {}).get('cells', [])
  ):
    if cell['name'] != 'listops_einsum_f32':
      continue
    for row in cell.get('rows', []):
      if row['status'] == 'ok' and row['steps_per_sec']:
        return 1.5 * 5000 / row['steps_per_sec'] + 120
  return None


def machine():
  """What this process can say about the machine without touching JAX
  (which would take the accelerator from the cells): nvidia-smi's GPU
  list where there is one, CPU count, Python."""
  info = {
    'cpu_count': os.cpu_count(),
    'python': platform.python_version(),
    'platform': platform.platform(),
  }
  if shutil.which('nvidia-smi'):
    try:
      proc = subprocess.run(
        [
          'nvidia-smi',
          '--query-gpu=name,memory.total,driver_version',
          '--format=csv,noheader',
        ],
        capture_output=True,
        text=True,
        timeout=20,
      )
      info['nvidia_smi'] = proc.stdout.strip().splitlines()
    except (OSError, subprocess.SubprocessError):
      pass
  return info


def run(out, budget_s=480.0, tiny=False, sections=SECTIONS):
  """Runs the plan within budget_s seconds; returns the report (also in
  out/devicecheck.json, rewritten after every cell)."""
  start = time.perf_counter()
  deadline = start + budget_s
  out = os.path.abspath(out)
  os.makedirs(os.path.join(out, 'logs'), exist_ok=True)
  cells = plan(out, tiny, sections)
  report = {
    'budget_s': budget_s,
    'tiny': tiny,
    'started_at': time.strftime('%Y-%m-%d %H:%M:%S'),
    'elapsed_s': 0.0,
    'done': False,
    'machine': machine(),
    'device': None,
    'sections': {
      s: {'priority': i + 1, 'title': TITLES[s], 'cells': []}
      for i, s in enumerate(SECTIONS)
      if s in sections
    },
  }
  path = os.path.join(out, REPORT)
  ratios = []  # actual / expected seconds of the cells that finished
  grace = GRACE_S[tiny] + MARGIN_S  # SIGINT this long before the deadline
  for cell in cells:
    scale = max(1.0, sum(ratios) / len(ratios)) if ratios else 1.0
    expected = cell['expected_s'] * scale
    if cell['kind'] == 'train':
      expected = training_estimate(report, tiny) or expected
    left = deadline - time.perf_counter()
    entry = {
      'name': cell['name'],
      'command': ['python', '-m', PROGRAMS[cell['kind']], *cell['args']],
      'expected_s': round(expected, 1),
    }
    if left - grace < expected:
      entry.update(
        status='skipped',
        reason=f'expected {expected:.0f} s, {max(left, 0):.0f} s of the '
        'budget left',
      )
    else:
      timeout = min(max(cell['max_s'], 2 * expected), left - grace)
      log_path = os.path.join(out, 'logs', f'{cell["name"]}.log')
      rc, seconds, timed_out = run_command(
        [PROGRAMS[cell['kind']], *cell['args']],
        log_path,
        timeout,
        GRACE_S[tiny],
      )
      status = 'timeout' if timed_out else ('ok' if rc == 0 else 'error')
      entry.update(
        status=status,
        returncode=rc,
        seconds=round(seconds, 1),
        timeout_s=round(timeout, 1),
        log=log_path,
      )
      if status != 'ok':
        entry['log_tail'] = _tail(log_path)
      elif cell['kind'] == 'benchmark':
        ratios.append(seconds / cell['expected_s'])
      if cell['kind'] == 'benchmark':
        entry['rows'] = read_benchmark_rows(cell['out'])
        report['device'] = report['device'] or device_of(cell['out'])
        if cell['section'] == 'fused_vs_einsum':
          entry['fused_over_einsum'] = fused_over_einsum(entry['rows'])
      else:
        entry['results'] = read_training(cell['out'])
    report['sections'][cell['section']]['cells'].append(entry)
    report['elapsed_s'] = round(time.perf_counter() - start, 1)
    write_json(path, report)
    print(_line(cell['section'], entry), flush=True)
  report['done'] = True
  report['elapsed_s'] = round(time.perf_counter() - start, 1)
  write_json(path, report)
  print(f'devicecheck: {report["elapsed_s"]:.0f} s of {budget_s:g}; {path}')
  return report


def _line(section, entry):
  """One progress line per cell."""
  head = f'[{section}] {entry["name"]}: {entry["status"]}'
  if entry['status'] == 'skipped':
    return f'{head} ({entry["reason"]})'
  head += f' in {entry["seconds"]:.0f} s'
  for row in entry.get('rows', []):
    if row['status'] == 'ok':
      mfu = '' if row['mfu'] is None else f', MFU {row["mfu"]:.1%}'
      head += (
        f'; {row["model"]} L={row["length"]} {row["steps_per_sec"]:.3g} '
        f'steps/s{mfu}'
      )
    else:
      head += f'; {row["model"]} L={row["length"]} {row["status"]}'
  results = entry.get('results') or {}
  if 'test_accuracy' in results:
    head += (
      f'; test {results["test_accuracy"]:.2f}% (paper '
      f'{results["paper_test_accuracy"]}%)'
    )
  return head


def parse_sections(text):
  names = [s.strip() for s in text.split(',') if s.strip()]
  bad = [s for s in names if s not in SECTIONS]
  if bad or not names:
    raise UserError(
      f'--sections {text!r} names no known section; choose from '
      f'{", ".join(SECTIONS)}.'
    )
  return tuple(names)


def main(argv=None):
  parser = argparse.ArgumentParser(
    prog='python -m experiments.device.devicecheck',
    description='One accelerator session of checks, in priority order.',
  )
  parser.add_argument('--out', required=True, help='Output directory.')
  parser.add_argument(
    '--budget_s',
    type=float,
    default=480.0,
    help='Seconds for all cells together (default 480).',
  )
  parser.add_argument(
    '--tiny',
    action='store_true',
    help='Smoke configs, short lengths, few steps: seconds on a CPU.',
  )
  parser.add_argument(
    '--sections',
    default=','.join(SECTIONS),
    help='Comma-separated subset of: ' + ', '.join(SECTIONS) + '.',
  )
  args = parser.parse_args(argv)
  try:
    if args.budget_s <= 0:
      raise UserError(
        f'--budget_s={args.budget_s:g} is not positive; give the seconds '
        'the checks may take, e.g. --budget_s 480.'
      )
    if os.path.exists(args.out) and not os.path.isdir(args.out):
      raise UserError(
        f'--out {args.out} is a file, not a directory; give a directory.'
      )
    run(args.out, args.budget_s, args.tiny, parse_sections(args.sections))
  except UserError as e:
    print(f'error: {e}', file=sys.stderr)
    sys.exit(2)


def cli():
  """The command line: Ctrl-C is one line, exit 130 (the cells run in
  their own process groups; what they wrote so far is kept)."""
  try:
    main()
  except KeyboardInterrupt:
    print('Interrupted.', file=sys.stderr)
    sys.exit(130)


if __name__ == '__main__':
  cli()
