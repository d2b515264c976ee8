r"""The reference-scale tables of docs/results.md, from the queue's archives.

  python -m experiments.reference.report          # rewrites docs/results.md
  python -m experiments.reference.report --print  # prints the two tables
  python -m experiments.reference.report --archive DIR [--archive DIR2] \
      --results FILE

Reads each archive's queue.json (python -m experiments.reference.queue)
and the run files beside it, and writes two generated blocks of --results
(everything outside the markers is left as it is; missing markers are
added at the end of the file):

  <!-- reference:begin --> ... <!-- reference:end -->
      one row per task and model of the queue: the paper's number (LRA
      Table 1, lra/reference/lra_paper.json), ours (the test accuracy of
      the best-validation checkpoint, %), the steps run, the device and the
      date; a job stopped before its end shows its best validation
      accuracy and step, a failed one its error, one never started "not
      yet run". MQAR (no paper number) is one row per model: the best run
      of its (width, rate) grid, chosen on validation.
  <!-- device-speed:begin --> ... <!-- device-speed:end -->
      the speed/memory table: each model's steps/s and peak memory against
      the transformer's measured in the same job (one job per length),
      beside the paper's Table 2 ratios.

With no archive yet, every cell reads "not yet run".
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from experiments.reference import jobs as queue_jobs
from experiments.reference.archive import STATE
from experiments.reference.queue import ARCHIVE
from lra.errors import UserError
from lra.report import paper as lra_paper
from lra.train import rundir

RESULTS_MD = os.path.join('docs', 'results.md')
MARKERS = {
  'reference': ('<!-- reference:begin -->', '<!-- reference:end -->'),
  'speed': ('<!-- device-speed:begin -->', '<!-- device-speed:end -->'),
}
TASK_NAMES = {'listops': 'ListOps', 'pathfinder': 'Pathfinder-32'}
NOT_RUN = 'not yet run'
# MQAR's extra test splits (configs/mqar.py `zoology`: trained on 64:4).
SPLITS = ('64:8', '64:16')
# Results from leases before the queue: described in prose, never archived
# as files, so they are not table cells.
EARLIER = (
  'Earlier leases left no run files in git: the 2026-11-30 H200 ListOps '
  'attempt (stopped at step 1,050 of 5,000, 33.2% validation) is in '
  '[its section](#listops-at-the-reference-configuration-on-an-h200-partial)'
  ' and the H200 speed cells of 2026-11-30 and 2026-12-04 in '
  '[benchmark.md](benchmark.md); they are not cells here.'
)


def load(archives: list[str]) -> tuple[dict, list[dict], list[str]]:
  """({job name: record with 'folder'}, calls, archives read). Without any
  archive, the queue's own jobs, none run."""
  records, calls, read = {}, [], []
  for folder in archives:
    path = os.path.join(folder, STATE)
    if not os.path.exists(path):
      continue
    try:
      with open(path) as f:
        data = json.load(f)
    except ValueError as e:
      raise UserError(f'{path} is not valid JSON ({e}).') from None
    read.append(folder)
    calls += data.get('calls', [])
    for name, record in data.get('jobs', {}).items():
      records.setdefault(name, dict(record, folder=os.path.join(folder, name)))
  if not read:
    for job in queue_jobs.queue_jobs():
      records[job.name] = dict(job.meta(), status='pending', attempts=[])
  return records, calls, read


def _pct(x) -> str:
  return '-' if x is None else f'{100 * x:.2f}'


def _int(n) -> str:
  return '-' if n is None else f'{n:,}'


def _read(folder: str | None, name: str):
  return rundir.read_json(os.path.join(folder, name)) if folder else None


def best_val(folder: str | None) -> tuple[float, int] | None:
  """(best validation accuracy, its step) of metrics.jsonl, or None."""
  best = None
  try:
    with open(os.path.join(folder, 'metrics.jsonl')) as f:
      for line in f:
        try:
          row = json.loads(line)
        except ValueError:
          continue
        if row.get('split') == 'val' and row.get('accuracy') is not None:
          if best is None or row['accuracy'] > best[0]:
            best = (row['accuracy'], row['step'])
  except (OSError, TypeError):
    return None
  return best


def _last(record: dict) -> dict:
  attempts = record.get('attempts') or [{}]
  return attempts[-1]


def train_cell(record: dict) -> tuple[str, str]:
  """(ours, steps) of a train job's record."""
  status = record.get('status', 'pending')
  folder = record.get('folder')
  total = record.get('num_steps')
  if status == 'done':
    results = _read(folder, 'results.json') or {}
    test = rundir.selected_test(results, _read(folder, 'config.json'))
    ours = f'**{_pct(test["accuracy"])}**' if test else 'done, no test'
    return ours, f'{_int(results.get("last_step"))} of {_int(total)}'
  if status == 'pending':
    return NOT_RUN, ''
  steps = f'{_int(record.get("step"))} of {_int(total)}'
  if status == 'failed':
    return f'failed: {record.get("error", "")[:120]}', steps
  best = best_val(folder)
  val = f', best val {_pct(best[0])} at {best[1]:,}' if best else ''
  return f'stopped{val}', steps


def _device_date(record: dict) -> tuple[str, str]:
  last = _last(record)
  return last.get('device', ''), (last.get('date') or '')[:10]


def reference_table(records: dict, table1: dict) -> list[str]:
  lines = [
    '| task | model | paper | ours | steps | device | date |',
    '|---|---|---|---|---|---|---|',
  ]
  for record in records.values():
    task = record.get('task')
    if record.get('kind') != 'train' or task not in TASK_NAMES:
      continue
    row, model = record['row'], record['model']
    label = row if model == row else f'{row} (`{model}`)'
    paper = lra_paper.paper_value(table1, row, task)
    ours, steps = train_cell(record)
    device, date = _device_date(record) if ours != NOT_RUN else ('', '')
    paper_text = '-' if paper is None else f'{paper:.2f}'
    lines.append(
      f'| {TASK_NAMES[task]} | {label} | {paper_text} | {ours} | {steps} | '
      f'{device} | {date} |'
    )
  return lines


def mqar_table(records: dict) -> list[str]:
  """One row per model: its best done run on validation, the grid's size."""
  by_model: dict[str, list[dict]] = {}
  for name, record in records.items():
    if record.get('task') == 'mqar' and record.get('kind') == 'train':
      grid = name.split('/')[1] if name.count('/') == 2 else ''
      by_model.setdefault(record['row'], []).append(dict(record, grid=grid))
  if not by_model:
    return []
  lines = [
    '| model | test, 4 pairs | 8 pairs | 16 pairs | chosen (width, lr) '
    '| runs done | device | date |',
    '|---|---|---|---|---|---|---|---|',
  ]
  for model, runs in by_model.items():
    done = []
    for r in runs:
      if r.get('status') != 'done':
        continue
      results = _read(r.get('folder'), 'results.json') or {}
      val = (results.get('val') or {}).get('accuracy')
      if val is not None:
        done.append((val, r, results))
    count = f'{len(done)} of {len(runs)}'
    if not done:
      lines.append(f'| {model} | {NOT_RUN} | | | | {count} | | |')
      continue
    _, r, results = max(done, key=lambda d: d[0])
    splits = results.get('test_splits', {})
    extra = [_pct((splits.get(s) or {}).get('accuracy')) for s in SPLITS]
    device, date = _device_date(r)
    test = (results.get('test') or {}).get('accuracy')
    grid = r['grid'].replace('_lr', ', lr ').lstrip('w')
    lines.append(
      f'| {model} | **{_pct(test)}** | {extra[0]} | {extra[1]} | {grid} | '
      f'{count} | {device} | {date} |'
    )
  return lines


def reference_block(records: dict, calls: list[dict], read: list[str]) -> str:
  table1 = lra_paper.paper()['table1_accuracy']
  jobs = [r for r in records.values() if not r.get('retired')]
  done = sum(r.get('status') == 'done' for r in jobs)
  seconds = sum(r.get('device_seconds', 0) for r in jobs)
  where = ', '.join(f'`{a}`' for a in read) or 'no archive yet'
  out = [
    'Generated by `python -m experiments.reference.report` from the '
    f'reference queue ({where}): {done} of {len(jobs)} jobs done, '
    f'{len(calls)} calls, {seconds / 60:.0f} device-minutes so far. Ours '
    'is the test accuracy (%) of the best-validation checkpoint; the '
    'transformer row runs `transformer_fused` (cuDNN flash attention in '
    'bfloat16; the same function as the einsum). Commands and costs: '
    '[experiments/reference/README.md](../experiments/reference/README.md).',
    '',
    *reference_table(records, table1),
  ]
  mqar = mqar_table(records)
  if mqar:
    steps = {
      r.get('num_steps')
      for r in records.values()
      if r.get('task') == 'mqar' and r.get('num_steps')
    } or {queue_jobs.MQAR_STEPS}
    out += [
      '',
      "MQAR at Zoology's protocol (`configs/mqar.py:<model>,zoology`, "
      f'{"/".join(f"{n:,}" for n in sorted(steps))} steps, trained on 4 '
      'pairs at length 64; the run of each model chosen on validation over '
      'its width x learning-rate grid):',
      '',
      *mqar,
    ]
  out += ['', EARLIER]
  return '\n'.join(out)


# ------------------------------------------------------------------ speed
def _ratio(x, y) -> float | None:
  return x / y if x and y else None


def speed_block(records: dict) -> str:
  """Speed and memory against the transformer, ours beside the paper's."""
  ref = lra_paper.paper()['table2_efficiency']
  speed_jobs = {
    r['length']: r for r in records.values() if r.get('kind') == 'speed'
  }
  lengths = sorted(speed_jobs) or list(queue_jobs.LENGTHS)
  cells, models, notes, cudnn = {}, [], [], False
  for length in lengths:
    record = speed_jobs.get(length)
    if not record or record.get('status') == 'pending':
      notes.append(f'{length}: {NOT_RUN}')
      continue
    rows = _read(record.get('folder'), 'benchmark.json') or []
    device, date = _device_date(record)
    partial = '' if record['status'] == 'done' else f' ({record["status"]})'
    notes.append(f'{length}: {device}, {date}{partial}')
    for row in rows:
      if row.get('model') not in models:
        models.append(row.get('model'))
      cells[(row.get('model'), length)] = row
      cudnn |= row.get('fused_attention_kernel') == 'cudnn'
  if not models:  # nothing measured yet: the rows the paper has
    models = [
      m
      for m in queue_jobs.SPEED_MODELS
      if m in ref['steps_per_sec'] or m == 'transformer_fused'
    ]
  head = '| model | ' + ' | '.join(_length(n) for n in lengths) + ' |'
  rule = '|---|' + '---|' * len(lengths)
  tables = {}
  for what, key, unit in (
    ('speed', 'steps_per_sec', 'steps/s'),
    ('memory', 'peak_memory_bytes', 'GB'),
  ):
    paper = ref['steps_per_sec' if what == 'speed' else 'peak_memory_gb']
    lines = [head, rule]
    for model in models:
      label = f'`{model}`' + (
        ' (cuDNN)' if model == 'transformer_fused' and cudnn else ''
      )
      row = [label]
      for i, length in enumerate(lengths):
        row.append(
          _speed_cell(cells, model, length, key, unit, paper, ref, i, what)
        )
      lines.append('| ' + ' | '.join(row) + ' |')
    tables[what] = lines
  return '\n'.join(
    [
      'Generated by `python -m experiments.reference.report` from the '
      "reference queue's `speed/<length>` jobs (`python benchmark.py "
      '--preset paper --dtype bfloat16 --lengths L`: the Text paper model, '
      'batch 32 on one device, bfloat16, each model a process). Each cell '
      'is ours against the transformer measured in the same job, then the '
      "paper's (LRA Table 2, 16 TPU v3 chips); the transformer row gives "
      "its own steps/s and GB. Memory is the compiled step's peak (XLA).",
      '',
      'Steps per second, against the transformer (ours / paper):',
      '',
      *tables['speed'],
      '',
      'Peak memory, against the transformer (ours / paper):',
      '',
      *tables['memory'],
      '',
      'Jobs: ' + '; '.join(notes) + '. A model has a row once a job has '
      'measured it (every model of experiments/reference/jobs.py '
      '`SPEED_MODELS`, 24, in each job).',
    ]
  )


def _length(n: int) -> str:
  return f'{n // 1024}K' if n % 1024 == 0 else str(n)


def _speed_cell(cells, model, length, key, unit, paper, ref, i, what):
  theirs = None
  if length in ref['lengths'] and model in paper and model != 'transformer':
    j = ref['lengths'].index(length)
    theirs = _ratio(paper[model][j], paper['transformer'][j])
  theirs_text = '-' if theirs is None else f'{theirs:.2f}x'
  row = cells.get((model, length))
  if row is None:
    ours_text = NOT_RUN if not cells_at(cells, length) else '-'
    return ours_text + ('' if theirs is None else f' / {theirs_text}')
  if row.get('status') != 'ok':
    return str(row.get('status')) + f' / {theirs_text}'
  value = row.get(key)
  if what == 'memory' and value is not None:
    value = value / 1e9
  if model == 'transformer':
    return f'{value:.3g} {unit}' if value is not None else '-'
  base = cells.get(('transformer', length))
  base_value = base.get(key) if base and base.get('status') == 'ok' else None
  if what == 'memory' and base_value is not None:
    base_value = base_value / 1e9
  ours = _ratio(value, base_value)
  ours_text = '-' if ours is None else f'{ours:.2f}x'
  return f'{ours_text} / {theirs_text}'


def cells_at(cells: dict, length: int) -> bool:
  return any(n == length for _, n in cells)


# ------------------------------------------------------------- the page
def replace_block(text: str, which: str, body: str) -> str:
  """`text` with the block between MARKERS[which] replaced by `body` (the
  markers added at the end when missing)."""
  begin, end = MARKERS[which]
  block = f'{begin}\n{body}\n{end}'
  i, j = text.find(begin), text.find(end)
  if i < 0 or j < i:
    return text.rstrip('\n') + '\n\n' + block + '\n'
  return text[:i] + block + text[j + len(end) :]


def main(argv=None) -> None:
  p = argparse.ArgumentParser(
    prog='python -m experiments.reference.report',
    description="Writes docs/results.md's reference and speed tables.",
  )
  p.add_argument(
    '--archive', action='append', help=f'an archive (default {ARCHIVE})'
  )
  p.add_argument('--results', default=RESULTS_MD, help='the page to rewrite')
  p.add_argument('--print', action='store_true', help='print, write nothing')
  args = p.parse_args(sys.argv[1:] if argv is None else argv)
  try:
    records, calls, read = load(args.archive or [ARCHIVE])
    reference = reference_block(records, calls, read)
    speed = speed_block(records)
    if args.print:
      print(reference + '\n\n' + speed)
      return
    try:
      with open(args.results) as f:
        text = f.read()
    except OSError as e:
      raise UserError(f'cannot read {args.results}: {e.strerror}.') from None
    text = replace_block(text, 'reference', reference)
    text = replace_block(text, 'speed', speed)
    with open(args.results, 'w') as f:
      f.write(text)
    print(f'wrote the reference and speed tables of {args.results}')
  except UserError as e:
    print(f'error: {e}', file=sys.stderr)
    sys.exit(2)


if __name__ == '__main__':
  main()
