"""experiments/device/devicecheck.py: --tiny on this CPU, within its budget, and the plan.

No timing assertions beyond the budget: speeds on a shared CPU say nothing.
"""

import json
import os
import subprocess
import sys
import time

import pytest

from experiments.device import devicecheck

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STATUSES = {'ok', 'error', 'timeout', 'skipped'}
# What a devicecheck process may take beyond its budget: its own start-up
# and the last JSON write.
SLACK_S = 20


def run_devicecheck(out, budget_s, *extra):
  start = time.perf_counter()
  proc = subprocess.run(
    [
      sys.executable,
      '-m',
      'experiments.device.devicecheck',
      '--out',
      str(out),
      '--tiny',
      '--budget_s',
      str(budget_s),
      *extra,
    ],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=budget_s + 120,
  )
  seconds = time.perf_counter() - start
  assert proc.returncode == 0, proc.stderr[-800:]
  with open(os.path.join(out, 'devicecheck.json')) as f:
    return json.load(f), seconds


def cells_of(report):
  """(section, cell) in priority order (the JSON's keys are sorted)."""
  sections = sorted(report['sections'].items(), key=lambda s: s[1]['priority'])
  return [
    (name, cell) for name, section in sections for cell in section['cells']
  ]


def test_tiny_run_completes_within_its_budget(tmp_path):
  budget = 90
  report, seconds = run_devicecheck(tmp_path, budget)
  assert seconds < budget + SLACK_S
  assert report['done'] and report['tiny'] and report['elapsed_s'] <= budget
  assert list(report['sections']) == sorted(devicecheck.SECTIONS)
  assert [report['sections'][s]['priority'] for s in devicecheck.SECTIONS] == [
    1,
    2,
    3,
    4,
  ]
  planned = devicecheck.plan(str(tmp_path), tiny=True)
  assert [c['name'] for _, c in cells_of(report)] == [
    c['name']
    for s in devicecheck.SECTIONS
    for c in planned
    if c['section'] == s
  ]
  assert {c['status'] for _, c in cells_of(report)} <= STATUSES
  # The first cell (the most important) always fits a budget this size.
  first = report['sections']['reference_throughput']['cells'][0]
  assert first['name'] == 'listops_einsum_f32'
  assert first['status'] == 'ok', first.get('log_tail')
  (row,) = first['rows']
  assert row['status'] == 'ok' and row['task'] == 'listops'
  assert row['mode'] == 'throughput' and row['examples_per_sec'] > 0
  assert row['mfu'] is None  # no peak FLOP/s for a CPU
  assert report['device']['backend'] == 'cpu'
  for _, cell in cells_of(report):
    if cell['status'] == 'skipped':
      assert 'budget left' in cell['reason']
    elif cell['name'] == 'transformer_smoke' and cell['status'] == 'ok':
      results = cell['results']
      assert results['paper_test_accuracy'] == 36.37
      assert 0 <= results['test_accuracy'] <= 100
    elif cell['name'] == 'text_64' and cell['status'] == 'ok':
      assert {r['model'] for r in cell['rows']} >= {'transformer'}


@pytest.mark.slow
def test_a_small_budget_stops_early_and_keeps_what_it_finished(tmp_path):
  budget = 40
  report, seconds = run_devicecheck(tmp_path, budget)
  assert seconds < budget + SLACK_S
  assert report['done'] and report['elapsed_s'] <= budget
  statuses = [c['status'] for _, c in cells_of(report)]
  assert statuses[0] in ('ok', 'timeout')  # it started the first cell
  assert 'skipped' in statuses  # and stopped starting new ones
  assert set(statuses) <= STATUSES
  assert len(statuses) == len(devicecheck.plan(str(tmp_path), tiny=True))
  first = report['sections']['reference_throughput']['cells'][0]
  if first['status'] == 'ok':
    assert first['rows'][0]['steps_per_sec'] > 0
  else:  # killed at the budget: its log's tail is kept
    assert first['timeout_s'] <= budget and 'log_tail' in first


def test_plan_and_budget_accounting_without_running(tmp_path, monkeypatch):
  """Cells are started only while their expected cost fits the time left
  (on a clock the fake cells advance); each gets min(its cap, the time
  left less the grace) as its timeout."""

  class Clock:
    now = 0.0
    strftime = staticmethod(time.strftime)

    @classmethod
    def perf_counter(cls):
      return cls.now

  calls = []

  def run_command(args, log_path, timeout_s, grace_s):
    calls.append((args, timeout_s))
    Clock.now += 9.0  # each cell: 9 s, a little over its 8 s estimate
    return 0, 9.0, False

  monkeypatch.setattr(devicecheck, 'time', Clock)
  monkeypatch.setattr(devicecheck, 'run_command', run_command)
  report = devicecheck.run(
    str(tmp_path), budget_s=30, tiny=True, sections=devicecheck.SECTIONS
  )
  statuses = [c['status'] for _, c in cells_of(report)]
  # 30 s less 6 s of grace and margin: two 9 s cells, then 6 s left < the
  # third's expected 9 s (8 s scaled by 9 / 8), and nothing after fits.
  assert statuses[:2] == ['ok', 'ok'] and set(statuses[2:]) == {'skipped'}
  assert [t for _, t in calls] == [24.0, 15.0]
  skipped = report['sections']['listops_training']['cells'][0]
  assert skipped['reason'] == 'expected 11 s, 12 s of the budget left'
  assert calls[0][0][0] == 'lra.bench.main'
  assert '--config=configs/listops.py:transformer,smoke' in calls[0][0]
  full = devicecheck.plan(str(tmp_path))
  assert [c['name'] for c in full if c['section'] == 'fused_vs_einsum'] == [
    'text_1024',
    'text_2048',
    'text_3072',
    'text_4096',
  ]
  train = [c for c in full if c['kind'] == 'train']
  assert train[0]['args'][0] == '--config=configs/listops.py:transformer'
  saved = json.loads((tmp_path / 'devicecheck.json').read_text())
  assert saved['done'] and len(cells_of(saved)) == len(statuses)


def test_bad_budget_is_one_sentence(tmp_path):
  with pytest.raises(SystemExit) as e:
    devicecheck.main(['--out', str(tmp_path), '--budget_s', '0'])
  assert e.value.code == 2
  with pytest.raises(devicecheck.UserError, match='no known section'):
    devicecheck.parse_sections('nope')
