"""The reference queue's archive: its state (queue.json), each job's small
files and carried checkpoint, and the tarball that leaves the machine.

What it holds is described in experiments/reference/queue.py; the report
(experiments/reference/report.py) reads it.
"""

from __future__ import annotations

import json
import os
import shutil
import tarfile

from experiments.reference.jobs import CARRY, MACHINE, RERUN, Job
from lra.errors import UserError

STATE = 'queue.json'
# A run's files the archive keeps (what the report and eval.py read).
RUN_FILES = ('config.json', 'metrics.jsonl', 'results.json')
SPEED_FILES = ('benchmark.json', 'benchmark.md')
# A checkpoint travels when it is under CARRY_LIMIT_BYTES and the archive
# with it under CARRY_TOTAL_BYTES (the tarball must stay under 16 MiB, and
# each lease's checkpoints are committed).
CARRY_LIMIT_BYTES = 4 << 20
CARRY_TOTAL_BYTES = 12 << 20
TARBALL_LIMIT_BYTES = 16 << 20
LOG_TAIL_LINES = 60


def _steps_in(folder: str) -> list[int]:
  try:
    return sorted(int(n) for n in os.listdir(folder) if n.isdigit())
  except OSError:
    return []


def latest_step(workdir: str) -> int:
  """The step of workdir's newest saved checkpoint (0: none)."""
  steps = _steps_in(os.path.join(workdir, 'checkpoints', 'latest'))
  return steps[-1] if steps else 0


def num_steps(workdir: str) -> int | None:
  """config.json's num_train_steps of a train.py workdir, or None."""
  try:
    with open(os.path.join(workdir, 'config.json')) as f:
      return int(json.load(f)['num_train_steps'])
  except (OSError, ValueError, KeyError, TypeError):
    return None


def _size(path: str) -> int:
  total = 0
  for folder, _, files in os.walk(path):
    total += sum(os.path.getsize(os.path.join(folder, f)) for f in files)
  return total


def _copy_newest(src: str, dst: str) -> None:
  """checkpoints/{latest,best}: only the newest step of each."""
  for which in ('latest', 'best'):
    steps = _steps_in(os.path.join(src, which))
    if steps:
      shutil.copytree(
        os.path.join(src, which, str(steps[-1])),
        os.path.join(dst, which, str(steps[-1])),
      )


def log_tail(path: str) -> str:
  try:
    with open(path, errors='replace') as f:
      text = f.read()
  except OSError:
    return ''
  lines = [ln.rstrip() for ln in text.replace('\r', '\n').split('\n')]
  return '\n'.join([ln for ln in lines if ln][-LOG_TAIL_LINES:]) + '\n'


def error_line(log_text: str, returncode: int) -> str:
  """The sentence that says why a job failed: its last `error:` line, else
  its last line, with the exit status."""
  lines = [ln for ln in log_text.splitlines() if ln.strip()]
  errors = [ln for ln in lines if ln.startswith('error:')]
  last = errors[-1] if errors else (lines[-1] if lines else 'no output')
  return f'exit {returncode}: {last.strip()[:400]}'


# ----------------------------------------------------------------- state
class State:
  """ARCHIVE/queue.json: every job's record, the calls and the data
  preparations."""

  def __init__(self, archive: str, jobs: list[Job], name: str):
    self.archive = archive
    self.path = os.path.join(archive, STATE)
    data = {}
    if os.path.exists(self.path):
      try:
        with open(self.path) as f:
          data = json.load(f)
      except ValueError as e:
        raise UserError(
          f'{self.path} is not valid JSON ({e}); restore it from git.'
        ) from None
    if data and data.get('queue') != name:
      raise UserError(
        f'{archive} holds the {data.get("queue")!r} queue, not {name!r}; '
        'give another --archive (--tiny has its own).'
      )
    old = data.get('jobs', {})
    self.jobs = {}
    for job in jobs:
      record = dict(old.get(job.name) or {'status': 'pending', 'step': 0})
      record.setdefault('attempts', [])
      record.update(job.meta())
      self.jobs[job.name] = record
    # Jobs of an older queue keep their records (nothing measured is lost).
    for name_, record in old.items():
      self.jobs.setdefault(name_, dict(record, retired=True))
    self.calls = data.get('calls', [])
    self.prepare = data.get('prepare', [])
    self.name = name

  def save(self) -> None:
    os.makedirs(self.archive, exist_ok=True)
    data = {
      'queue': self.name,
      'note': 'Written by python -m experiments.reference.queue; read by '
      'python -m experiments.reference.report.',
      'jobs': self.jobs,
      'calls': self.calls,
      'prepare': self.prepare,
    }
    tmp = self.path + '.tmp'
    with open(tmp, 'w') as f:
      json.dump(data, f, indent=1)
      f.write('\n')
    os.replace(tmp, self.path)


def remaining_seconds(job: Job, record: dict, workdir: str) -> float:
  """Expected seconds to finish `job`: from its earlier attempts' rate when
  it has one (steps per second, or cells per second for a speed length),
  else its expected seconds scaled by the steps left."""
  attempts = record.get('attempts', [])
  if job.kind == 'speed':
    done = [a for a in attempts if a.get('cells_done')]
    if done:
      a = done[-1]
      return a['seconds'] * len(job.cells) / a['cells_done']
    return job.seconds
  step = latest_step(workdir) if job.resume != RERUN else 0
  if job.resume == CARRY and not step:
    step = record.get('step', 0) if record.get('checkpoint') == 'carried' else 0
  total = num_steps(workdir) or record.get('num_steps')
  rated = [a for a in attempts if a.get('to_step', 0) > a.get('from_step', 0)]
  if total and rated:
    a = rated[-1]
    rate = (a['to_step'] - a['from_step']) / max(a['seconds'], 1e-9)
    return (total - step) / rate
  if total:
    return job.seconds * (1 - step / total)
  return job.seconds


def restore_run(job: Job, workdir: str, dst: str, record: dict) -> None:
  """Puts the job's work folder in the state its start expects: this
  machine's own checkpoint kept, a carried one put back in place (with the
  run files it goes with), or a clean folder for a fresh start."""
  if job.kind == 'train' and latest_step(workdir):
    return  # this machine's own checkpoint: the run resumes from it
  if os.path.isdir(workdir):
    shutil.rmtree(workdir)
  carried = os.path.join(dst, 'checkpoints')
  if job.resume == CARRY and record.get('checkpoint') == 'carried':
    if latest_step(dst):
      os.makedirs(workdir)
      shutil.copytree(carried, os.path.join(workdir, 'checkpoints'))
      for name in RUN_FILES:
        src = os.path.join(dst, name)
        if os.path.exists(src):
          shutil.copy2(src, workdir)


def archive_run(
  job: Job,
  workdir: str,
  dst: str,
  record: dict,
  status: str,
  log_text: str,
  archive: str,
) -> None:
  """Copies the job's small files from `workdir` into its archive folder
  `dst` (of `archive`), and its checkpoint when it travels (CARRY, not done,
  under CARRY_LIMIT_BYTES and, with the whole archive, CARRY_TOTAL_BYTES);
  sets record['checkpoint'] to where the checkpoint is."""
  os.makedirs(dst, exist_ok=True)
  for name in os.listdir(dst):
    if name != 'checkpoints':
      path = os.path.join(dst, name)
      shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
  names = SPEED_FILES if job.kind == 'speed' else RUN_FILES
  names += tuple(
    n for n in listdir(workdir) if n.startswith('eval_') and n.endswith('.json')
  )
  for name in names:
    src = os.path.join(workdir, name)
    if os.path.isfile(src):
      shutil.copy2(src, dst)
  with open(os.path.join(dst, 'log_tail.txt'), 'w') as f:
    f.write(log_text)
  old = os.path.join(dst, 'checkpoints')
  if job.kind != 'train' or status == 'done':
    shutil.rmtree(old, ignore_errors=True)
    record.pop('checkpoint', None)
    return
  if job.resume == MACHINE:
    record['checkpoint'] = 'on the machine' if latest_step(workdir) else 'none'
    return
  ckpt = os.path.join(workdir, 'checkpoints')
  if not latest_step(workdir):  # stopped before its first save
    record['checkpoint'] = 'carried' if latest_step(dst) else 'none'
    return
  tmp = os.path.join(dst, 'checkpoints.new')
  shutil.rmtree(tmp, ignore_errors=True)
  _copy_newest(ckpt, tmp)
  size = _size(tmp)
  others = _size(archive) - _size(dst)
  if size > CARRY_LIMIT_BYTES or others + size > CARRY_TOTAL_BYTES:
    shutil.rmtree(tmp)
    shutil.rmtree(old, ignore_errors=True)
    record['checkpoint'] = f'not carried ({size / 2**20:.1f} MiB)'
    return
  shutil.rmtree(old, ignore_errors=True)
  os.replace(tmp, old)
  record['checkpoint'] = 'carried'


def listdir(path: str) -> list[str]:
  try:
    return os.listdir(path)
  except OSError:
    return []


def read_rows(path: str) -> list:
  try:
    with open(path) as f:
      rows = json.load(f)
  except (OSError, ValueError):
    return []
  return rows if isinstance(rows, list) else []


def write_tarball(archive: str, path: str) -> int:
  """ARCHIVE as one .tgz (its folder name at the top); returns its size."""
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with tarfile.open(path, 'w:gz') as tar:
    tar.add(archive, arcname=os.path.basename(os.path.normpath(archive)))
  return os.path.getsize(path)


# The work folder's copy of the archive, kept on the machine between calls.
MIRROR = '_archive'


def _calls(folder: str, name: str | None = None) -> int:
  """How many calls `folder`'s queue.json records (-1: none, or another
  queue than `name`)."""
  try:
    with open(os.path.join(folder, STATE)) as f:
      data = json.load(f)
    if name is not None and data.get('queue') != name:
      return -1
    return len(data.get('calls', []))
  except (OSError, ValueError, AttributeError):
    return -1


def adopt_newer(archive: str, work: str, name: str) -> bool:
  """Replaces `archive` by the work folder's copy of the `name` queue when
  that copy has more calls (a second call on the same machine, sent a tree
  whose archive predates the first call's tarball); returns whether it
  did."""
  mirror = os.path.join(work, MIRROR)
  if _calls(mirror, name) <= _calls(archive):
    return False
  shutil.rmtree(archive, ignore_errors=True)
  shutil.copytree(mirror, archive)
  return True


def keep_mirror(archive: str, work: str) -> None:
  """Copies `archive` to the work folder (for adopt_newer)."""
  mirror = os.path.join(work, MIRROR)
  shutil.rmtree(mirror, ignore_errors=True)
  shutil.copytree(archive, mirror)
