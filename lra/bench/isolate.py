"""Each benchmark cell in its own process, killed past its deadline.

--cell_timeout_s (default 300): each cell runs in its own process
(`python -m lra.bench.main --cell_spec=...`), killed when it runs past the
deadline and recorded with status 'timeout' (with what it wrote before:
compile time, memory, FLOPs); the run goes on with the next cell. A hang in
XLA's compiler or a device call cannot be interrupted from inside a
process, which is why a cell is a process. Each cell pays the start-up
(imports and device initialisation), and device memory is freed between
cells, so device_peak_bytes_in_use is the cell's own. --cell_timeout_s=0
runs every cell in this process without a deadline.
"""

import gc
import json
import os
import signal
import subprocess
import time

from lra.bench.cells import base_row
from lra.bench.measure import run_cell
from lra.bench.report import write_report
from lra.train import child
from lra.train.metrics import write_json


def cell_command(spec, row_path):
  """The command of a cell's own process (lra.bench.main with
  --cell_spec; lra/train/child.py)."""
  return child.command(
    'lra.bench.main',
    '--cell_spec=' + json.dumps(spec),
    '--cell_out=' + row_path,
  )


def _stop(proc):
  """Kills the cell's process group (its own session) and waits for it."""
  try:
    os.killpg(proc.pid, signal.SIGKILL)
  except (ProcessLookupError, PermissionError):
    pass
  proc.wait()


def _last_line(path):
  try:
    with open(path, errors='replace') as f:
      lines = [ln.strip() for ln in f.read().splitlines() if ln.strip()]
  except OSError:
    return ''
  return lines[-1][:300] if lines else ''


def run_isolated(spec, out, index, timeout_s):
  """Runs one cell in its own process, killed past `timeout_s` seconds:
  its row (status 'timeout' then, with what the cell wrote before)."""
  cells = os.path.join(out, 'cells')
  os.makedirs(cells, exist_ok=True)
  row_path = os.path.join(cells, f'cell_{index:03d}.json')
  log_path = os.path.join(cells, f'cell_{index:03d}.log')
  if os.path.exists(row_path):
    os.remove(row_path)
  start = time.perf_counter()
  timed_out = False
  with open(log_path, 'w') as log:
    proc = subprocess.Popen(
      cell_command(spec, row_path),
      stdout=log,
      stderr=subprocess.STDOUT,
      start_new_session=True,
      env=child.env(),
    )
    try:
      proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
      timed_out = True
      _stop(proc)
    except (
      BaseException
    ):  # Ctrl-C, SIGINT from experiments.device.devicecheck: no orphan
      _stop(proc)
      raise
  seconds = time.perf_counter() - start
  row = base_row(spec)
  try:
    with open(row_path) as f:
      row.update(json.load(f))
  except (OSError, ValueError):
    pass
  if timed_out:
    compiled = row.get('compile_seconds')
    row['status'] = 'timeout'
    row['error'] = f'ran past --cell_timeout_s={timeout_s:g} and was killed' + (
      f' (compiled in {compiled:.0f} s)' if compiled is not None else ''
    )
  elif row.get('status') in (None, 'running'):
    row['status'] = 'error'
    row['error'] = (
      f'the cell process exited with status {proc.returncode} before its '
      f'row was complete: {_last_line(log_path)} (log: {log_path})'
    )
  row.update(
    cell_seconds=seconds, cell_timeout_s=timeout_s, isolation='process'
  )
  return row


def run_cells(specs, out, *, cell_timeout_s=None):
  """Runs every cell (each in its own process, killed past cell_timeout_s
  seconds; in this process when it is None or 0), rewrites
  out/benchmark.json after each, then writes the report; returns the rows."""
  os.makedirs(out, exist_ok=True)
  rows = []
  # Other work on a shared CPU slows every cell; the table says how busy.
  load = os.getloadavg()[0] if hasattr(os, 'getloadavg') else None
  start = time.perf_counter()
  for i, spec in enumerate(specs):
    if cell_timeout_s:
      row = run_isolated(spec, out, i, cell_timeout_s)
    else:
      row = run_cell(spec)
      row['isolation'] = 'in_process'
    rows.append(row)
    write_json(os.path.join(out, 'benchmark.json'), rows)
    print(progress_line(i + 1, len(specs), row), flush=True)
    gc.collect()
  seconds = time.perf_counter() - start
  write_report(rows, out, seconds=seconds, load=load)
  print(f'{len(specs)} cells in {seconds:.0f} s; wrote {out}/benchmark.md')
  return rows


def progress_line(i, n, row):
  where = f' L={row["length"]}' if row.get('length') else ''
  head = f'[{i}/{n}] {row["model"]}{where} ({row.get("mode")}):'
  if row['status'] != 'ok':
    return f'{head} {row["status"]} ({row["error"]})'
  line = (
    f'{head} {row["steps_per_sec"]:.3g} steps/s, '
    f'{row["examples_per_sec"]:.3g} examples/s, '
    f'{row["peak_memory_bytes"] / 1e6:.0f} MB'
  )
  if row.get('compile_seconds') is not None:
    line += f', compile {row["compile_seconds"]:.1f} s'
  if row.get('mfu') is not None:
    line += f', MFU {row["mfu"]:.1%}'
  if row.get('loop_steps_per_sec'):
    line += (
      f'; loop {row["loop_steps_per_sec"]:.3g} steps/s = '
      f'{row["loop_over_bare"]:.2f} x the bare step'
    )
  if row.get('fused_attention_kernel'):
    line += ', cuDNN fused attention'
  return line


def run_child(spec_json, row_path):
  """--cell_spec: measures one cell here, writing its row to row_path when
  it starts, once compiled and when done (so a killed cell left its
  compile time and memory)."""
  spec = json.loads(spec_json)
  partial = dict(base_row(spec), status='running')
  write_json(row_path, partial)

  def on_compiled(row):
    write_json(row_path, dict(row, status='running'))

  write_json(row_path, run_cell(spec, on_compiled))
