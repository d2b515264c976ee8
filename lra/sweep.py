r"""A resumable sweep over tasks x models: LRA Table 1 as one command.

  python -m lra.sweep --tasks listops,pathfinder --models all --preset small \
      --out runs/sweep [--config.<key>=<value> ...] [--dry_run] [--bench DIR]

Each (task, model) trains in its own workdir OUT/<task>/<model>[-<preset>],
one after the other, by the command a user would type,

  python train.py --config configs/<task>.py:<model>[,<preset>] \
      --workdir OUT/<task>/<model>[-<preset>] [--config.<key>=<value> ...]

run as a subprocess (its progress bar and messages pass through), so every run
resumes like any train.py run and shows in `python eval.py --table OUT`.

--tasks and --models: names joined by commas, or 'all' (every task of
lra/tasks/__init__.py; every model of configs/models.py), '-name' leaves one out
(`--models all,-transformer_fused`). --preset: small, smoke, or none (the
LRA reference configuration). --config.* overrides go to every run unchanged.

Self-pretraining: --preset small_spt (or smoke_spt, spt; configs/base.py)
gives two runs per (task, model), the pretraining then its fine-tune:

  python train.py --config configs/<task>.py:<model>,small_spt \
      --workdir OUT/<task>/<model>-small_spt
  python train.py --config configs/<task>.py:<model>,small \
      --workdir OUT/<task>/<model>-small_spt-ft \
      --config.init_from=OUT/<task>/<model>-small_spt

The fine-tune runs only when its pretraining finished (else it is recorded
as failed, not run). The overrides of objective, mask_rate and
model.tie_lm_head go to the pretraining alone (--config.objective=causal_lm
pretrains left to right); --config.init_from is refused (the sweep sets it).

A run is skipped when its workdir holds a finished run of the same config
(results.json for the configured num_train_steps, config.json equal). A run
that fails (train.py exits non-zero) is recorded with its one-line error (its
last `error:` line, else its last line) and exit status; the sweep goes on.
After each run, OUT/sweep.json records every run (entries of earlier sweeps
into OUT that this one does not plan are kept) and OUT/table.md holds
`eval.py --table OUT`. Per run: task, model, preset, workdir, command, status
(done, failed, skipped = finished before, interrupted, pending = not reached
after an interrupt), exit status, message, wall_seconds (train.py's wall time
over every sweep that ran it), steps_per_sec (the median of metrics.jsonl's
training rates), steps_done, best_step, val_accuracy, test_accuracy (the one
the table reports: results.json `select`) and selection, val_loss and
test_loss, objective (classify, or causal_lm / masked_lm for a pretraining
run: it has no accuracy; its test_token_accuracy and, for causal_lm,
test_perplexity are those of its checkpoint of lowest validation loss).
table.md has the pretraining runs' losses below the accuracy table.
OUT/runs.md is one row per classification run: status, test accuracy, best
validation accuracy and step, wall time, steps/s and the LRA paper's Table 1
number (the README's CPU-scale table is made from it).

Ctrl-C (or SIGTERM) is passed to the running train.py as one Ctrl-C: it
finishes its step, saves a checkpoint and exits; the sweep records that run as
interrupted, writes sweep.json and table.md and exits with 130. A second
Ctrl-C stops train.py at once (its last saved checkpoint stays). The same
command resumes the sweep: finished runs are skipped, the interrupted one
resumes from its checkpoint. Exit status: 0, 1 when a run failed, 130 when
interrupted, 2 for bad flags (one sentence).

--dry_run prints each run's command and an estimate of its training time
(steps only: no compilation, evaluation or data generation) and writes
nothing. The rate is the one measured in the run's workdir when it has
trained before, else benchmark.py's steps/s for the model (--bench, default
runs/bench/benchmark.json) at the benchmarked length nearest the run's,
scaled by the ratio of a dense Transformer's cost per step (batch x length x
layers x (4 E Q + 2 E M + 2 length Q)) of the benchmark cell to the run's:
rough (within about 2x of measured ListOps and Pathfinder `small` runs),
closer when the benchmark ran at the sweep's lengths
(`python benchmark.py --lengths 200,1024 --out runs/bench`).
"""

import dataclasses
import json
import math
import os
import re
import shlex
import signal
import statistics
import subprocess
import sys
import threading
import time

from absl import app, flags
from ml_collections import config_flags

from configs import base as base_config
from configs import models as model_configs
from lra import cli, report, tasks, validate
from lra.errors import UserError
from lra.metrics import read_rows, write_json

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_BENCH = os.path.join('runs', 'bench', 'benchmark.json')
# config.json's record of optimiser changes on resuming (lra/runtime.py).
_CHANGES_KEY = 'resume_changes'
_OVERRIDE = re.compile(r'^--?(no)?config\.')


# ----------------------------------------------------------------- plan
@dataclasses.dataclass(frozen=True)
class Run:
  """One (task, model) of a sweep: its workdir and train.py command.

  A fine-tune (`pretrained`: the self-pretraining preset, e.g. small_spt)
  is named <model>-<pretrained>-ft and starts from the encoder of the run
  <model>-<pretrained> (--config.init_from)."""

  task: str
  model: str
  preset: str
  out: str
  overrides: tuple = ()
  pretrained: str = ''

  @property
  def name(self):
    if self.pretrained:
      return f'{self.task}/{self.model}-{self.pretrained}-ft'
    return f'{self.task}/{self.model}' + (
      f'-{self.preset}' if self.preset else ''
    )

  @property
  def pretraining(self):
    """The pretraining run a fine-tune starts from (None: not a fine-tune)."""
    if not self.pretrained:
      return None
    return Run(self.task, self.model, self.pretrained, self.out)

  @property
  def workdir(self):
    return os.path.join(self.out, self.name)

  @property
  def config_arg(self):
    model = f'{self.model},{self.preset}' if self.preset else self.model
    return f'{_from_cwd(os.path.join("configs", self.task + ".py"))}:{model}'

  def argv(self):
    """train.py's arguments, as a user would type them."""
    source = self.pretraining
    init = [f'--config.init_from={source.workdir}'] if source else []
    return [
      _from_cwd('train.py'),
      '--config',
      self.config_arg,
      '--workdir',
      self.workdir,
      *init,
      *self.overrides,
    ]

  def command(self):
    return shlex.join(['python', *self.argv()])


def _from_cwd(path):
  """A file of the repository, relative to the working directory when it is
  inside the repository (the usual case), else absolute."""
  full = os.path.join(ROOT, path)
  rel = os.path.relpath(full)
  return full if rel.startswith('..') else rel


def select_names(spec, known, flag):
  """'all' or 'a,b,-c' -> names in the order given; one sentence when a
  name is unknown or none is left."""
  items = [s.strip() for s in spec.split(',') if s.strip()]
  drop = {s[1:] for s in items if s.startswith('-')}
  keep = [s for s in items if not s.startswith('-')]
  names = [n for k in keep for n in (known if k == 'all' else [k])]
  bad = [n for n in [*keep, *drop] if n not in known and n != 'all']
  if bad:
    raise UserError(
      f'Unknown name {bad[0]!r} in {flag}; valid: all, {", ".join(known)}.'
    )
  names = [n for n in dict.fromkeys(names) if n not in drop]
  if not names:
    raise UserError(
      f'{flag} {spec!r} leaves nothing to run; name at least one, e.g. '
      f'{flag} {known[0]}.'
    )
  return names


# Overrides that a self-pretraining preset's pretraining run alone takes
# (its fine-tune classifies); every other override goes to both.
PRETRAINING_KEYS = ('objective', 'mask_rate', 'model.tie_lm_head')


def _override_key(arg):
  return _OVERRIDE.sub('', arg).split('=', 1)[0]


def plan(task_spec, model_spec, preset, out, overrides=()):
  """The runs of a sweep, task by task, in the order given; a
  self-pretraining preset (configs/base.py FINE_TUNE_PRESET, e.g.
  small_spt) gives two runs per (task, model): the pretraining, then the
  fine-tune from its encoder."""
  preset = '' if preset in ('', 'none') else preset
  known = (*base_config.PRESETS, *base_config.ALIASES)
  if preset and preset not in known:
    raise UserError(
      f'Unknown preset {preset!r} in --preset; valid: none, {", ".join(known)}.'
    )
  task_names = select_names(task_spec, tuple(tasks.TASKS), '--tasks')
  model_names = select_names(
    model_spec, model_configs.known_models(), '--models'
  )
  overrides = tuple(overrides)
  if preset not in base_config.FINE_TUNE_PRESET:
    return [
      Run(t, m, preset, out, overrides) for t in task_names for m in model_names
    ]
  given = [a for a in overrides if _override_key(a).startswith('init_from')]
  if given:
    raise UserError(
      f"--preset {preset} sets each fine-tune's --config.init_from itself; "
      f'drop {given[0]} (or use --preset '
      f'{base_config.FINE_TUNE_PRESET[preset] or "none"}).'
    )
  fine_tune = tuple(
    a for a in overrides if _override_key(a) not in PRETRAINING_KEYS
  )
  return [
    run
    for t in task_names
    for m in model_names
    for run in (
      Run(t, m, preset, out, overrides),
      Run(
        t,
        m,
        base_config.FINE_TUNE_PRESET[preset],
        out,
        fine_tune,
        pretrained=preset,
      ),
    )
  ]


def run_config(run):
  """(the run's config as train.py will parse it, None) or (None, the one
  sentence train.py would print). Imports no jax."""
  argv = ['train.py', f'--config={run.config_arg}', *run.overrides]
  values = flags.FlagValues()
  config_flags.DEFINE_config_file(
    'config', None, '', flag_values=values, lock_config=True, sys_argv=argv
  )
  try:
    values(argv)
    return values.config, None
  except (
    OSError,
    flags.Error,
    KeyError,
    ValueError,
    AttributeError,
    TypeError,
  ) as e:
    return None, cli._sentence(e)  # pylint: disable=protected-access


# -------------------------------------------------------------- workdir
def _read_json(path):
  try:
    with open(path) as f:
      return json.load(f)
  except (OSError, ValueError):
    return None


def latest_step(workdir):
  """The newest saved training step (checkpoint folder names), or 0."""
  path = os.path.join(workdir, 'checkpoints', 'latest')
  names = os.listdir(path) if os.path.isdir(path) else []
  return max((int(n) for n in names if n.isdigit()), default=0)


def measured_rate(workdir):
  """The median of metrics.jsonl's training steps/s, or None."""
  path = os.path.join(workdir, 'metrics.jsonl')
  try:
    rows = read_rows(path)
  except (OSError, ValueError):
    return None
  rates = [
    r['steps_per_sec']
    for r in rows
    if r.get('split') == 'train' and r.get('steps_per_sec')
  ]
  return float(statistics.median(rates)) if rates else None


def outcome(workdir):
  """The result fields of a sweep.json entry, from the workdir's files
  (objective None: no results.json yet)."""
  out = {
    'steps_done': latest_step(workdir),
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
  }
  results = _read_json(os.path.join(workdir, 'results.json'))
  if (
    results and results.get('last_step', out['steps_done']) < out['steps_done']
  ):
    results = None  # an earlier, shorter run's: training has gone on since
  if not results:
    return out
  out['objective'] = results.get('objective', 'classify')
  out['steps_done'] = max(out['steps_done'], results.get('last_step') or 0)
  val = results.get('val') or {}
  if out['objective'] != 'classify':
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
  # The test accuracy the table reports: results.json `select` picks the
  # best-validation checkpoint's (`test`) or the final step's (`test_last`);
  # results without it have only `test`.
  select = results.get('select') or 'best_val'
  test = results.get('test_last' if select == 'last' else 'test') or {}
  out.update(
    best_step=results.get('best_step'),
    val_accuracy=val.get('accuracy'),
    test_accuracy=test.get('accuracy'),
    selection=select,
    val_loss=val.get('loss'),
    test_loss=test.get('loss'),
  )
  return out


def finished(run, config):
  """True when run.workdir holds a finished run of exactly `config`."""
  results = _read_json(os.path.join(run.workdir, 'results.json'))
  saved = _read_json(os.path.join(run.workdir, 'config.json'))
  if config is None or not results or not isinstance(saved, dict):
    return False
  steps = results.get('last_step') or latest_step(run.workdir)
  if steps < config.num_train_steps:
    return False
  saved.pop(_CHANGES_KEY, None)
  return saved == json.loads(config.to_json())


# ------------------------------------------------------------- running
def duration(seconds):
  """'42s', '9m 21s', '2h 05m'."""
  seconds = int(round(seconds))
  if seconds < 60:
    return f'{seconds}s'
  if seconds < 3600:
    return f'{seconds // 60}m {seconds % 60:02d}s'
  return f'{seconds // 3600}h {seconds % 3600 // 60:02d}m'


def _percent(x):
  return '-' if x is None else f'{100 * x:.2f}%'


def result_text(entry):
  parts = []
  if entry.get('steps_per_sec'):
    parts.append(f'{entry["steps_per_sec"]:.3g} steps/s')
  if entry.get('objective') not in (None, 'classify'):
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


def error_line(stderr_tail, returncode):
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


class Sweep:
  """Runs the planned runs one at a time; forwards Ctrl-C to the running one."""

  def __init__(self, runs, out, command=''):
    self.runs, self.out, self.command = runs, out, command
    self.stops = 0
    self.child = None
    self.entries = {}
    self.handled = set()  # runs this invocation reached
    previous = _read_json(os.path.join(out, 'sweep.json'))
    if isinstance(previous, dict):
      for entry in previous.get('runs', []):
        self.entries[entry['name']] = entry

  # ---- signals
  def _on_signal(self, signum, frame):
    del signum, frame
    self.stops += 1
    child = self.child
    if child is None:
      _say('\nStopping before the next run.\n')
      return
    if self.stops == 1:
      _say(
        '\nStopping: the current run saves a checkpoint and stops (Ctrl-C '
        'again stops it at once); the same command resumes the sweep.\n'
      )
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
    tail = bytearray()

    def tee(stream):
      for chunk in iter(lambda: os.read(stream.fileno(), 4096), b''):
        os.write(sys.stderr.fileno(), chunk)
        tail.extend(chunk)
        del tail[:-16384]

    start = time.monotonic()
    # Its own process group: a terminal's Ctrl-C reaches the sweep alone,
    # which passes it on once (two would stop train.py without saving).
    child = subprocess.Popen(
      [sys.executable, *run.argv()],
      stderr=subprocess.PIPE,
      process_group=0,
    )
    self.child = child
    if self.stops:
      self._forward(child)
    reader = threading.Thread(target=tee, args=(child.stderr,), daemon=True)
    reader.start()
    returncode = child.wait()
    reader.join()
    child.stderr.close()
    self.child = None
    return returncode, time.monotonic() - start, tail.decode(errors='replace')

  def _entry(self, run, status, **fields):
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
    _print(f'{head} running {run.command()}')
    fresh = latest_step(run.workdir) == 0
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
  def run(self):
    signals = (signal.SIGINT, signal.SIGTERM)
    previous = {s: signal.signal(s, self._on_signal) for s in signals}
    try:
      n = len(self.runs)
      for i, run in enumerate(self.runs, 1):
        if self.stops:
          break
        if self._one(run, i, n):
          self.handled.add(run.name)
        self.write(final=False)
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

  @property
  def _table_path(self):
    return os.path.join(self.out, 'table.md')


def _print(text):
  print(text, flush=True)


def _say(text):
  """From a signal handler: unbuffered, so it cannot re-enter a write."""
  os.write(sys.stderr.fileno(), text.encode())


def runs_markdown(entries):
  """OUT/runs.md: one row per run of sweep.json (classification runs),
  with its wall time and rate beside the LRA paper's Table 1 number."""
  table1 = report.paper()['table1_accuracy']
  lines = [
    '| task | model | preset | status | test | best val (step) | wall | '
    'steps/s | LRA paper |',
    '|---|---|---|---|---|---|---|---|---|',
  ]
  for e in entries:
    if e.get('objective') not in (None, 'classify'):
      continue
    paper_value = report.paper_value(table1, e['model'], e['task'])
    best = (
      f'{_percent(e.get("val_accuracy"))} ({e.get("best_step")})'
      if e.get('val_accuracy') is not None
      else '-'
    )
    wall = e.get('wall_seconds')
    rate = e.get('steps_per_sec')
    lines.append(
      f'| {e["task"]} | `{e["model"]}` | {e.get("preset") or "-"} | '
      f'{"done" if e["status"] == "skipped" else e["status"]} | '
      f'{_percent(e.get("test_accuracy"))} | {best} | '
      f'{duration(wall) if wall else "-"} | '
      f'{f"{rate:.2f}" if rate else "-"} | '
      f'{"-" if paper_value is None else f"{paper_value:.2f}"} |'
    )
  return '\n'.join(lines)


# ------------------------------------------------------------ estimates
def load_benchmark(path):
  """(file, ok rows) of a benchmark.py output (a --out folder or its
  benchmark.json); the default file may be absent (then None)."""
  given = path is not None
  path = DEFAULT_BENCH if path is None else path
  if os.path.isdir(path):
    path = os.path.join(path, 'benchmark.json')
  if not os.path.exists(path):
    if given:
      raise UserError(
        f'--bench {path} does not exist; give a benchmark.py --out folder or '
        'its benchmark.json.'
      )
    return None
  rows = _read_json(path)
  if not isinstance(rows, list):
    raise UserError(f'{path} is not a benchmark.py benchmark.json; rerun it.')
  return path, [r for r in rows if r.get('status') == 'ok']


def step_cost(batch, length, layers, emb, qkv, mlp):
  """A dense Transformer's multiply-adds per training step, up to a constant
  factor: projections, feed-forward and exact attention per token."""
  return (
    batch * length * layers * (4 * emb * qkv + 2 * emb * mlp + 2 * length * qkv)
  )


def estimate(run, config, bench):
  """(steps/s, where it comes from) for the run, or (None, why not)."""
  rate = measured_rate(run.workdir)
  if rate:
    return rate, 'measured in its workdir'
  if config is None:
    return None, 'its config does not parse'
  if bench is None:
    return None, 'no benchmark'
  m = config.model
  length = config.max_length + (1 if m.pooling == 'cls' else 0)
  length *= tasks.TASKS[config.task].num_inputs
  rows = [r for r in bench[1] if r['model'] == run.model]
  if not rows:
    return None, f'{run.model} is not in the benchmark'
  row = min(rows, key=lambda r: abs(math.log(r['sequence_length'] / length)))
  mc = row['model_config']
  cost = step_cost(
    row['batch_size'],
    row['sequence_length'],
    mc['num_layers'],
    mc['emb_dim'],
    mc['qkv_dim'],
    mc['mlp_dim'],
  )
  ours = step_cost(
    config.batch_size, length, m.num_layers, m.emb_dim, m.qkv_dim, m.mlp_dim
  )
  return (
    row['steps_per_sec'] * cost / ours,
    f'benchmark at length {row["length"]}, batch {row["batch_size"]}, scaled',
  )


def dry_run(runs, bench_path):
  """Prints each run's command and estimated training time; writes nothing."""
  bench = load_benchmark(bench_path)
  if bench is None:
    _print(
      f'No benchmark found ({DEFAULT_BENCH}; --bench DIR gives one): the '
      'time of a run that has not trained yet is unknown.'
    )
  else:
    _print(
      f'Estimates from {bench[0]} (benchmark.py steps/s at the nearest '
      "length, scaled to each run's batch, length and width: rough) or from "
      "a run's own metrics.jsonl; training steps only."
    )
  total, unknown, skipped = 0.0, 0, 0
  for i, run in enumerate(runs, 1):
    config, problem = run_config(run)
    head = f'[{i}/{len(runs)}] {run.name}:'
    if problem:
      _print(f'{head} would fail: {problem}')
      unknown += 1
    elif finished(run, config):
      _print(f'{head} finished, would be skipped')
      skipped += 1
    else:
      left = config.num_train_steps - latest_step(run.workdir)
      rate, source = estimate(run, config, bench)
      if rate:
        seconds = left / rate
        total += seconds
        _print(
          f'{head} about {duration(seconds)} ({left} steps at '
          f'{rate:.3g} steps/s; {source})'
        )
      else:
        unknown += 1
        _print(f'{head} {left} steps, time unknown ({source})')
    _print(f'  {run.command()}')
  counted = len(runs) - unknown - skipped
  tail = [f'{skipped} finished'] if skipped else []
  tail += [f'{unknown} unknown'] if unknown else []
  _print(
    f'Total: about {duration(total)} for {counted} '
    f'run{"s" * (counted != 1)}'
    + (f' ({", ".join(tail)})' if tail else '')
    + '.'
  )


# --------------------------------------------------------------- flags
def define_flags():
  flags.DEFINE_string(
    'tasks', None, "Tasks, comma-separated, or 'all'; '-name' drops one."
  )
  flags.DEFINE_string(
    'models', None, "Models, comma-separated, or 'all'; '-name' drops one."
  )
  flags.DEFINE_string(
    'preset',
    '',
    'small, smoke, small_spt (self-pretraining, then the fine-tune), '
    'smoke_spt, spt or none (default: none, the reference).',
  )
  flags.DEFINE_string('out', None, 'Sweep folder: OUT/<task>/<model>[-preset].')
  flags.DEFINE_bool(
    'dry_run', False, 'Print the commands and estimated times; run nothing.'
  )
  flags.DEFINE_string(
    'bench',
    None,
    f'With --dry_run: a benchmark.py --out folder or its benchmark.json '
    f'(default {DEFAULT_BENCH} when present).',
  )


def parse_flags(argv):
  """absl flags_parser: --config.* overrides pass through to train.py."""
  overrides = [a for a in argv[1:] if _OVERRIDE.match(a)]
  rest = [argv[0], *(a for a in argv[1:] if not _OVERRIDE.match(a))]
  return [*cli.parse_flags(rest), *overrides]


def main(argv):
  overrides = [a for a in argv[1:] if _OVERRIDE.match(a)]
  extra = [a for a in argv[1:] if not _OVERRIDE.match(a)]
  f = flags.FLAGS
  try:
    if extra:
      raise UserError(
        f'Unexpected argument {extra[0]!r}; config overrides are written '
        '--config.<key>=<value>.'
      )
    missing = [n for n in ('tasks', 'models', 'out') if not f[n].value]
    if missing:
      raise UserError(
        f'Give --{missing[0]}, e.g. python -m lra.sweep --tasks listops '
        '--models all --preset small --out runs/sweep.'
      )
    runs = plan(f.tasks, f.models, f.preset, f.out, overrides)
    if f.dry_run:
      dry_run(runs, f.bench)
      return
    if f.bench:
      raise UserError('--bench is read by --dry_run only; add --dry_run.')
    validate.check_dir(f.out, '--out')
    command = shlex.join(['python', '-m', 'lra.sweep', *sys.argv[1:]])
    sys.exit(Sweep(runs, f.out, command).run())
  except UserError as e:
    print(f'error: {e}', file=sys.stderr)
    sys.exit(2)


if __name__ == '__main__':
  define_flags()
  app.run(main, flags_parser=parse_flags)
