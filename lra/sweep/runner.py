"""Running a sweep's plan (lra/sweep/main.py): one train.py subprocess at a time
(or up to --jobs at once), Ctrl-C / SIGTERM passed on to each running one
once, each run's result read back from its workdir (lra/train/rundir.py), and
OUT/sweep.json, OUT/table.md and OUT/runs.md written after every run.

With jobs > 1 the runs start in plan order as slots free up (a fine-tune
waits for its pretraining run); each run's output goes to
<workdir>/train.log instead of the terminal (K progress bars would
interleave), and the sweep prints one line as each starts and ends. On a
GPU the runs share it: XLA's preallocation of 75% of its memory per
process is turned off for them (XLA_PYTHON_CLIENT_PREALLOCATE=false,
unless set), so K processes fit."""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time

from lra.errors import UserError
from lra.report import paper
from lra.report import tables as report
from lra.sweep import grid as sweep_grid
from lra.sweep.plan import TRAIN_MODULE, Run, run_config
from lra.train import child as child_process
from lra.train import config as config_loader
from lra.train import rundir
from lra.train.metrics import flatten, read_rows, write_json


# -------------------------------------------------------------- workdir
def measured_rate(workdir: str) -> float | None:
  """The median of metrics.jsonl's training steps/s, or None."""
  path = os.path.join(workdir, 'metrics.jsonl')
  try:
    rows = read_rows(path)
  except (OSError, ValueError, UserError):  # a rate is a hint: none
    return None
  rates = [
    r['steps_per_sec']
    for r in rows
    if r.get('split') == 'train' and r.get('steps_per_sec')
  ]
  return float(statistics.median(rates)) if rates else None


def outcome(workdir: str) -> dict:
  """The result fields of a sweep.json entry, from the workdir's files
  (objective None: no results.json yet)."""
  out = {
    'steps_done': rundir.latest_step(workdir),
    'steps_per_sec': measured_rate(workdir),
    'objective': None,
    'best_step': None,
    'val_accuracy': None,
    'test_accuracy': None,
    'selection': None,
    'val_loss': None,
    'test_loss': None,
    'test_token_accuracy': None,
    'test_perplexity': None,
    'test_splits': None,
  }
  results = rundir.read_results(workdir)
  if (
    results and results.get('last_step', out['steps_done']) < out['steps_done']
  ):
    results = None  # an earlier, shorter run's: training has gone on since
  if not results:
    return out
  out['objective'] = results.get('objective', 'classify')
  out['steps_done'] = max(out['steps_done'], results.get('last_step') or 0)
  val = results.get('val') or {}
  if rundir.is_lm_run(results):
    # An LM objective (pretraining): no class accuracy; the checkpoint of
    # the lowest validation loss, its loss, token accuracy, perplexity.
    test = results.get('test') or {}
    out.update(
      best_step=results.get('best_step'),
      val_loss=val.get('loss'),
      test_loss=test.get('loss'),
      test_token_accuracy=test.get('token_accuracy'),
      test_perplexity=test.get('perplexity'),
    )
    return out
  # The test accuracy the table reports: the best-validation checkpoint's
  # (`test`) or the final step's (`test_last`), by lra/train/rundir.py's
  # one rule (results.json `select`, else the selection of config.json).
  config = rundir.read_config(workdir)
  select = rundir.selection_of(results, config)
  test = rundir.selected_test(results, config) or {}
  out.update(
    best_step=results.get('best_step'),
    val_accuracy=val.get('accuracy'),
    test_accuracy=test.get('accuracy'),
    selection=select,
    val_loss=val.get('loss'),
    test_loss=test.get('loss'),
    test_splits={
      name: metrics.get('accuracy')
      for name, metrics in (results.get('test_splits') or {}).items()
    }
    or None,
  )
  return out


def finished(run: Run, config) -> bool:
  """True when run.workdir holds a finished run of exactly `config`."""
  results = rundir.read_results(run.workdir)
  if config is None or not results:
    return False
  steps = results.get('last_step') or rundir.latest_step(run.workdir)
  if steps < config.num_train_steps:
    return False
  return same_config(run, config)


def same_config(run: Run, config) -> bool:
  """True when run.workdir's saved config is exactly `config`."""
  saved = rundir.read_config(run.workdir)
  if config is None or saved is None:
    return False
  old = flatten(rundir.without_changes(saved))
  new = flatten(json.loads(config.to_json()))
  # A field added after the run was made had its default then: the run
  # counts as finished while the sweep keeps that default (as train.py
  # resumes it, lra/train/rundir.py check_resume).
  defaults = config_loader.predated_defaults(config)
  defaults = flatten(json.loads(defaults.to_json()))
  for key in set(new) - set(old):
    if key in defaults:
      old[key] = defaults[key]
  return old == new


def earlier_entries(out: str) -> dict:
  """{run name: entry} of the sweep.json an earlier sweep wrote into `out`
  ({} when there is none)."""
  # A damaged sweep.json is one sentence, not {}: the sweep rewrites the
  # file, and would drop every earlier record in it.
  path = os.path.join(out, 'sweep.json')
  previous = rundir.load_json(
    path,
    what='restore it or move it away (the sweep rewrites it), then run again.',
  )
  if previous is None:
    return {}
  runs = previous.get('runs', [])
  if not isinstance(runs, list):
    raise UserError(
      f'{path} holds runs that are not a list; restore it or move it away.'
    )
  return {e['name']: e for e in runs if isinstance(e, dict) and 'name' in e}


def diverged_before(run: Run, config, before: dict | None) -> bool:
  """Whether `before` (the run's entry in an earlier sweep) diverged with
  exactly `config`: the same config and seed diverge again (deterministic
  runs), so a sweep skips it and a grid counts it as tried
  (sweep_grid.tuned_rows)."""
  return bool(
    before and sweep_grid.diverged(before) and same_config(run, config)
  )


def duration(seconds: float) -> str:
  """'42s', '9m 21s', '2h 05m'."""
  seconds = int(round(seconds))
  if seconds < 60:
    return f'{seconds}s'
  if seconds < 3600:
    return f'{seconds // 60}m {seconds % 60:02d}s'
  return f'{seconds // 3600}h {seconds % 3600 // 60:02d}m'


def _percent(x):
  return '-' if x is None else f'{100 * x:.2f}%'


def result_text(entry: dict) -> str:
  parts = []
  if entry.get('steps_per_sec'):
    parts.append(f'{entry["steps_per_sec"]:.3g} steps/s')
  if entry.get('objective') not in (None, *rundir.ACCURACY_OBJECTIVES):
    text = (
      f'{entry["objective"]}: best step {entry["best_step"]} (lowest val '
      f'loss), val loss {entry["val_loss"]:.4f}, test loss '
      f'{entry["test_loss"]:.4f}, test token accuracy '
      f'{_percent(entry["test_token_accuracy"])}'
    )
    if entry.get('test_perplexity') is not None:
      text += f', test perplexity {entry["test_perplexity"]:.3f}'
    parts.append(text)
  elif entry.get('test_accuracy') is not None:
    parts.append(
      f'best step {entry["best_step"]}, val {_percent(entry["val_accuracy"])}'
      f', test {_percent(entry["test_accuracy"])}'
    )
  return ', '.join(parts)


def error_line(stderr_tail: str, returncode: int) -> str:
  """train.py's one-line error: its last `error:` line, else the last line
  (a traceback's exception), else how it ended."""
  lines = [ln.strip() for ln in re.split(r'[\r\n]', stderr_tail) if ln.strip()]
  errors = [ln for ln in lines if ln.startswith('error:')]
  if errors:
    return errors[-1]
  if returncode < 0:
    try:
      name = signal.Signals(-returncode).name
    except ValueError:
      name = f'signal {-returncode}'
    return f'killed by {name}' + (
      ' (out of memory?)' if -returncode == signal.SIGKILL else ''
    )
  return lines[-1] if lines else f'exit status {returncode}'


LOG = 'train.log'


class Sweep:
  """Runs the planned runs, `jobs` at a time (default one); forwards Ctrl-C
  to the running ones."""

  def __init__(self, runs, out, command='', jobs=1, retry_diverged=False):
    self.runs, self.out, self.command = runs, out, command
    self.jobs = max(1, int(jobs))
    self.retry_diverged = retry_diverged
    self.stops = 0
    self.children = set()
    self.lock = threading.RLock()  # entries, children, sweep.json
    self.entries = earlier_entries(out)
    self.handled = set()  # runs this invocation reached

  # ---- signals
  def _on_signal(self, signum, frame):
    del signum, frame
    self.stops += 1
    children = list(self.children)
    if not children:
      _say('\nStopping before the next run.\n')
      return
    if self.stops == 1:
      which = 'current run saves' if len(children) == 1 else 'running runs save'
      _say(
        f'\nStopping: the {which} a checkpoint and stop (Ctrl-C '
        'again stops them at once); the same command resumes the sweep.\n'
      )
    for child in children:
      self._forward(child)

  @staticmethod
  def _forward(child):
    """One Ctrl-C to train.py and its workers (its own process group)."""
    try:
      os.killpg(child.pid, signal.SIGINT)
    except ProcessLookupError:
      pass

  # ---- one run
  def _train(self, run):
    """Runs train.py; returns (exit status, wall seconds, stderr tail)."""
    if self.jobs > 1:
      return self._train_logged(run)
    tail = bytearray()

    def tee(stream):
      for chunk in iter(lambda: os.read(stream.fileno(), 4096), b''):
        os.write(sys.stderr.fileno(), chunk)
        tail.extend(chunk)
        del tail[:-16384]

    start = time.monotonic()
    # Its own process group: a terminal's Ctrl-C reaches the sweep alone,
    # which passes it on once (two would stop train.py without saving).
    child = self._start(run, stderr=subprocess.PIPE)
    reader = threading.Thread(target=tee, args=(child.stderr,), daemon=True)
    reader.start()
    returncode = child.wait()
    reader.join()
    child.stderr.close()
    self._finish(child)
    return returncode, time.monotonic() - start, tail.decode(errors='replace')

  def _train_logged(self, run):
    """_train for jobs > 1: stdout and stderr into <workdir>/train.log
    (appended: a resumed run keeps its earlier output)."""
    os.makedirs(run.workdir, exist_ok=True)
    path = os.path.join(run.workdir, LOG)
    start = time.monotonic()
    with open(path, 'ab') as log:
      child = self._start(run, stdout=log, stderr=log)
      returncode = child.wait()
    self._finish(child)
    with open(path, 'rb') as log:
      log.seek(max(0, os.path.getsize(path) - 16384))
      tail = log.read().decode(errors='replace')
    return returncode, time.monotonic() - start, tail

  def _start(self, run, **streams):
    env = child_process.env()
    if self.jobs > 1 and 'XLA_PYTHON_CLIENT_PREALLOCATE' not in os.environ:
      env['XLA_PYTHON_CLIENT_PREALLOCATE'] = 'false'
    with self.lock:
      child = subprocess.Popen(
        child_process.command(TRAIN_MODULE, *run.argv()),
        process_group=0,
        env=env,
        **streams,
      )
      self.children.add(child)
      if self.stops:
        self._forward(child)
    return child

  def _finish(self, child):
    with self.lock:
      self.children.discard(child)

  def _entry(self, run, status, **fields):
    with self.lock:
      return self._entry_locked(run, status, **fields)

  def _entry_locked(self, run, status, **fields):
    entry = {
      'name': run.name,
      'task': run.task,
      'model': run.model,
      'preset': run.preset,
      'workdir': run.workdir,
      'command': run.command(),
      'status': status,
      'exit_status': None,
      'message': None,
      'wall_seconds': (self.entries.get(run.name) or {}).get('wall_seconds'),
      'num_train_steps': None,
      'grid': dict(run.grid) if run.grid else None,
    }
    entry.update(outcome(run.workdir))
    entry.update(fields)
    self.entries[run.name] = entry
    return entry

  def _one(self, run, i, n):
    head = f'[{i}/{n}] {run.name}:'
    config, _ = run_config(run)
    steps = None if config is None else config.num_train_steps
    if finished(run, config):
      entry = self._entry(run, 'skipped', num_train_steps=steps)
      _print(f'{head} skipped, already finished ({result_text(entry)})')
      return entry
    before = None if self.retry_diverged else self.entries.get(run.name)
    if diverged_before(run, config, before):
      entry = self._entry(
        run,
        'failed',
        exit_status=before.get('exit_status'),
        message=before.get('message'),
        num_train_steps=steps,
      )
      _print(
        f'{head} skipped, diverged in an earlier sweep ({entry["message"]}) '
        f'Pass --retry_diverged, or delete {run.workdir}, to run it again.'
      )
      return entry
    if self.stops:  # Ctrl-C came while checking: start nothing
      return None
    source = run.pretraining
    if source and self.entries.get(source.name, {}).get('status') not in (
      'done',
      'skipped',
    ):
      message = f'not run: its pretraining run {source.name} did not finish'
      entry = self._entry(run, 'failed', message=message, num_train_steps=steps)
      _print(f'{head} {message}')
      return entry
    if self.jobs > 1:
      _print(f'{head} started (output: {os.path.join(run.workdir, LOG)})')
    else:
      _print(f'{head} running {run.command()}')
    fresh = rundir.latest_step(run.workdir) == 0
    returncode, wall, stderr = self._train(run)
    earlier = None if fresh else self._earlier_wall(run)
    total = wall + (earlier or 0.0)
    if returncode == 0:
      status = 'done'
    elif self.stops or returncode == 130:  # 130: train.py saved and stopped
      status = 'interrupted'
    else:
      status = 'failed'
    message = None if status == 'done' else error_line(stderr, returncode)
    entry = self._entry(
      run,
      status,
      exit_status=returncode,
      message=message,
      wall_seconds=total,
      num_train_steps=steps,
    )
    if status == 'done' and entry['objective'] is None:
      entry.update(status='failed', message='train.py wrote no results.json')
    took = f'{entry["status"]} in {duration(wall)}'
    if entry['status'] == 'done':
      _print(f'{head} {took}, {result_text(entry)}')
    elif entry['status'] == 'interrupted':
      _print(f'{head} {took} at step {entry["steps_done"]} ({message})')
    else:
      _print(f'{head} {took} (exit status {returncode}): {entry["message"]}')
    return entry

  def _earlier_wall(self, run):
    return (self.entries.get(run.name) or {}).get('wall_seconds')

  # ---- the sweep
  def _run_all(self):
    """The runs in plan order, up to self.jobs at once."""
    n = len(self.runs)
    if self.jobs == 1:
      for i, run in enumerate(self.runs, 1):
        if self.stops:
          break
        if self._one(run, i, n):
          self.handled.add(run.name)
        self.write(final=False)
      return
    futures = {}

    def one(run, i):
      source = run.pretraining
      if source is not None and source.name in futures:
        futures[source.name].result()  # started earlier: FIFO, no deadlock
      if self.stops:
        return
      if self._one(run, i, n):
        with self.lock:
          self.handled.add(run.name)
      with self.lock:
        self.write(final=False)

    with concurrent.futures.ThreadPoolExecutor(self.jobs) as pool:
      for i, run in enumerate(self.runs, 1):
        futures[run.name] = pool.submit(one, run, i)
      for future in futures.values():
        future.result()

  def run(self):
    signals = (signal.SIGINT, signal.SIGTERM)
    previous = {s: signal.signal(s, self._on_signal) for s in signals}
    try:
      self._run_all()
      for run in self.runs:  # not reached after an interrupt
        if run.name not in self.handled:
          config, _ = run_config(run)
          status = 'skipped' if finished(run, config) else 'pending'
          self._entry(run, status)
      self.write()
    finally:
      for s, handler in previous.items():
        signal.signal(s, handler)
    statuses = [self.entries[r.name]['status'] for r in self.runs]
    counts = ', '.join(
      f'{statuses.count(s)} {s}'
      for s in ('done', 'skipped', 'failed', 'interrupted', 'pending')
      if statuses.count(s)
    )
    tables = ' and table.md' if os.path.exists(self._table_path) else ''
    _print(f'Sweep: {counts}; wrote {self.out}/sweep.json{tables}.')
    if self.stops:
      return 130
    return 1 if 'failed' in statuses else 0

  def write(self, final=True):
    """sweep.json (every run of OUT), then table.md."""
    os.makedirs(self.out, exist_ok=True)
    planned = [r.name for r in self.runs]
    names = planned + [n for n in self.entries if n not in planned]
    rows = [self.entries[n] for n in names if n in self.entries]
    write_json(
      os.path.join(self.out, 'sweep.json'),
      {'command': self.command, 'runs': rows},
    )
    try:
      text = report.tables(self.out)
    except UserError as e:
      if final:
        _print(f'No table: {e}')
      return
    with open(self._table_path, 'w') as f:
      f.write(text + '\n')
    with open(os.path.join(self.out, 'runs.md'), 'w') as f:
      f.write(runs_markdown(rows) + '\n')
    if any(r.get('grid') for r in rows):
      with open(os.path.join(self.out, 'tuned.md'), 'w') as f:
        f.write(sweep_grid.tuned_markdown(rows) + '\n')

  @property
  def _table_path(self):
    return os.path.join(self.out, 'table.md')


_PRINT = threading.Lock()


def _print(text):
  """One whole line (runs of --jobs finish on several threads)."""
  with _PRINT:
    sys.stdout.write(text + '\n')
    sys.stdout.flush()


def _say(text):
  """From a signal handler: unbuffered, so it cannot re-enter a write."""
  os.write(sys.stderr.fileno(), text.encode())


def _preset_text(entry):
  """The preset, then the run's grid combination: 'small, lr=3e-3'."""
  grid = sweep_grid.label(tuple((entry.get('grid') or {}).items()))
  return ', '.join(p for p in (entry.get('preset'), grid) if p) or '-'


def runs_markdown(entries: list[dict]) -> str:
  """OUT/runs.md: one row per run of sweep.json (classification runs),
  with its wall time and rate beside the LRA paper's Table 1 number."""
  table1 = paper.paper()['table1_accuracy']
  lines = [
    '| task | model | preset | status | test | best val (step) | wall | '
    'steps/s | LRA paper |',
    '|---|---|---|---|---|---|---|---|---|',
  ]
  for e in entries:
    if e.get('objective') not in (None, *rundir.ACCURACY_OBJECTIVES):
      continue
    paper_value = paper.paper_value(table1, e['model'], e['task'])
    best = (
      f'{_percent(e.get("val_accuracy"))} ({e.get("best_step")})'
      if e.get('val_accuracy') is not None
      else '-'
    )
    wall = e.get('wall_seconds')
    rate = e.get('steps_per_sec')
    lines.append(
      f'| {e["task"]} | `{e["model"]}` | {_preset_text(e)} | '
      f'{"done" if e["status"] == "skipped" else e["status"]} | '
      f'{_percent(e.get("test_accuracy"))} | {best} | '
      f'{duration(wall) if wall else "-"} | '
      f'{f"{rate:.2f}" if rate else "-"} | '
      f'{"-" if paper_value is None else f"{paper_value:.2f}"} |'
    )
  return '\n'.join(lines)
