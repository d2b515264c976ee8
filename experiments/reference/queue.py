r"""The reference-scale queue: LRA's tables at the paper's scale, one
accelerator lease at a time (issue 48).

  python -m experiments.reference.queue --budget 540 [--lease 710] \
      [--archive experiments/reference/archive] [--tarball $OUT/archive.tgz]
  python -m experiments.reference.queue --list   # jobs, seconds, status
  python -m experiments.reference.queue --tiny --budget 300   # on a CPU

experiments/reference/lease.sh is the command of a lease (wheels, checks,
this); experiments/reference/README.md the steps around it.

Runs the next jobs of experiments/reference/jobs.py that fit the budget,
each in its own process (train.py or benchmark.py), in the queue's order:
a job that has the GPU to itself waits for the ones running to end, and
the sharing jobs run side by side (--slots at once, one job that spans
leases per task). At the deadline (--budget minus --tail seconds) each job
still running gets SIGTERM (train.py saves its checkpoint and stops;
benchmark.py keeps the cells it measured), then SIGKILL when the tail is
spent. Every job's small files are copied into the archive as it ends:

  ARCHIVE/queue.json   every job of the queue (its command, expected and
                       spent seconds, status: done, stopped, failed or
                       pending; the step reached; each attempt's date,
                       device, seconds, first and last step, exit status,
                       error), each call (date, device, budget) and each
                       data preparation (its seconds on this machine's CPU)
  ARCHIVE/<job>/       config.json, metrics.jsonl, results.json,
                       eval_*.json (train.py); benchmark.json, benchmark.md
                       (benchmark.py); log_tail.txt; checkpoints/ (the
                       newest latest and best) of a stopped job whose
                       checkpoint travels (Job.resume CARRY) and is small
                       (CARRY_LIMIT_BYTES; CARRY_TOTAL_BYTES for all)

--tarball writes the archive as one .tgz (for the device tool to bring back;
at most 16 MiB). The archive is committed after the lease; the next call
carries it in the tree and resumes: a done job is never run again, a
failed one is not either (--retry_failed), a stopped job with a carried
checkpoint continues from it, one whose checkpoint stayed on the machine
(MACHINE) continues when the work folder (--work) still holds it (a second
call on the same machine) and starts again elsewhere, and a RERUN job (a
speed length) is measured again whole.

The work folder also keeps a copy of the archive (WORK/_archive): a second
call on the same machine whose tree still carries the archive from before
the first call (its tarball not yet unpacked) takes that newer copy, so no
job is run twice.

A job starts only when its remaining expected seconds fit: the time left in
this call for RERUN, in the lease (--lease: this call and later calls on the
same machine) for MACHINE and CARRY, and for a spanning job whenever
MIN_SPAN_S are left (it continues in the next lease). Remaining seconds
come from the job's own earlier attempts when it has any (their measured
rate), else from its expected seconds.
"""

from __future__ import annotations

import argparse
import datetime
import os
import signal
import subprocess
import sys
import time

from experiments.reference import jobs as queue_jobs
from experiments.reference.archive import (
  TARBALL_LIMIT_BYTES,
  State,
  adopt_newer,
  archive_run,
  error_line,
  keep_mirror,
  latest_step,
  log_tail,
  num_steps,
  read_rows,
  remaining_seconds,
  restore_run,
  write_tarball,
)
from experiments.reference.jobs import RERUN, Job
from lra.errors import UserError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
ARCHIVE = os.path.join('experiments', 'reference', 'archive')
WORK = os.path.join('runs', 'reference')
# Seconds kept at the end of the budget for the archive and the tarball,
# after the jobs are killed.
ARCHIVE_RESERVE_S = 8
# The least time left worth starting a job that spans leases (a compile and
# some steps; less would only write a checkpoint).
MIN_SPAN_S = 120


def _now() -> str:
  return datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M')


def device_name() -> str:
  """The accelerator's name (nvidia-smi), else 'CPU (N cores)'."""
  try:
    out = subprocess.run(
      ['nvidia-smi', '--query-gpu=name', '--format=csv,noheader'],
      capture_output=True,
      text=True,
      timeout=20,
      check=True,
    ).stdout.strip()
    if out:
      names = out.splitlines()
      return names[0] + (f' x{len(names)}' if len(names) > 1 else '')
  except (OSError, subprocess.SubprocessError):
    pass
  return f'CPU ({os.cpu_count()} cores)'


# ------------------------------------------------------------------- run
class Running:
  """A job's process in this call."""

  def __init__(self, job: Job, workdir: str, log_path: str, env: dict):
    self.job, self.workdir, self.log_path = job, workdir, log_path
    self.from_step = latest_step(workdir) if job.kind == 'train' else 0
    self.start = time.monotonic()
    self.date = _now()
    self.signalled = False
    with open(log_path, 'w') as log:
      self.proc = subprocess.Popen(
        job.command(workdir),
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,  # its own group: SIGTERM reaches its cells
      )

  def signal(self, sig: int) -> None:
    try:
      os.killpg(self.proc.pid, sig)
    except OSError:
      pass


class Queue:
  """One call of the queue (run_queue is its entry point)."""

  def __init__(self, jobs, archive, work, name, *, say=print):
    self.jobs = jobs
    self.archive = archive
    self.work = work
    self.state = State(archive, jobs, name)
    self.say = say
    self.device = device_name()

  def workdir(self, job: Job) -> str:
    return os.path.join(self.work, job.name)

  def arch(self, job: Job) -> str:
    return os.path.join(self.archive, job.name)

  # --- before a start
  def restore(self, job: Job) -> None:
    restore_run(
      job, self.workdir(job), self.arch(job), self.state.jobs[job.name]
    )

  # --- after an end
  def finish(self, run: Running, *, stopped_by_us: bool) -> None:
    job, workdir = run.job, run.workdir
    rc = run.proc.returncode
    record = self.state.jobs[job.name]
    seconds = time.monotonic() - run.start
    attempt = {
      'date': run.date,
      'device': self.device,
      'seconds': round(seconds, 1),
      'exit': rc,
    }
    log_text = log_tail(run.log_path)
    if job.kind == 'train':
      done = rc == 0 and os.path.exists(os.path.join(workdir, 'results.json'))
      to_step = latest_step(workdir)
      if done:
        to_step = max(to_step, num_steps(workdir) or 0)
      attempt.update(from_step=run.from_step, to_step=to_step)
      record['step'] = to_step
      record['num_steps'] = num_steps(workdir) or record.get('num_steps')
    else:
      done = rc == 0
      rows = read_rows(os.path.join(workdir, 'benchmark.json'))
      attempt['cells_done'] = len(rows)
      record['step'] = len(rows)
      record['num_steps'] = len(job.cells)
    if done:
      status = 'done'
    elif run.signalled or stopped_by_us:
      status = 'stopped'
    else:
      status = 'failed'
      record['error'] = error_line(log_text, rc)
      attempt['error'] = record['error']
    if status != 'failed':
      record.pop('error', None)
    attempt['status'] = status
    record['status'] = status
    record['attempts'].append(attempt)
    record['device_seconds'] = round(
      sum(a['seconds'] for a in record['attempts']), 1
    )
    archive_run(
      job, workdir, self.arch(job), record, status, log_text, self.archive
    )
    self.state.save()
    self.say(
      f'{job.name}: {status} after {seconds:.0f} s'
      + (f' (step {record["step"]})' if job.kind == 'train' else '')
      + (f'; {record["error"]}' if status == 'failed' else '')
    )

  # --- the call
  def _fits(self, job: Job, left: float, min_span: float):
    """(whether the job may start with `left` seconds, its expected
    seconds): a spanning job needs only a useful stretch, the rest must
    finish."""
    record = self.state.jobs[job.name]
    need = remaining_seconds(job, record, self.workdir(job))
    # One whose checkpoint did not travel restarts every lease: it must fit.
    spans = job.spans and not str(record.get('checkpoint')).startswith('not')
    return (left >= min_span if spans else need <= left), need

  def todo(self, retry_failed: bool) -> list[Job]:
    out = []
    for job in self.jobs:
      status = self.state.jobs[job.name]['status']
      if status == 'done' or (status == 'failed' and not retry_failed):
        continue
      out.append(job)
    return out

  def run(
    self,
    budget: float,
    lease: float | None = None,
    *,
    tail: float = 30,
    slots: int = 8,
    retry_failed: bool = False,
    poll: float = 1.0,
    should_stop=None,
  ) -> dict:
    t0 = time.monotonic()
    lease = budget if lease is None else max(lease, budget)
    stop_at = t0 + budget - tail
    kill_at = t0 + budget - ARCHIVE_RESERVE_S
    lease_end = t0 + lease - tail
    min_span = min(MIN_SPAN_S, budget / 4)
    os.makedirs(self.work, exist_ok=True)
    logs = os.path.join(self.work, '_logs')
    os.makedirs(logs, exist_ok=True)
    call = {
      'date': _now(),
      'device': self.device,
      'budget_s': budget,
      'lease_s': lease,
      'started': [],
      'skipped': {},
    }
    self.state.calls.append(call)
    todo = self.todo(retry_failed)
    # Data for the jobs that may run in this lease, from the start.
    preparing = self._prepares(
      [j for j in todo if self._fits(j, lease_end - t0, min_span)[0]]
    )
    running: dict[str, Running] = {}
    started = set()
    base_env = dict(os.environ)
    while True:
      now = time.monotonic()
      if now >= stop_at or (should_stop is not None and should_stop(running)):
        break
      for name, run in list(running.items()):
        if run.proc.poll() is not None:
          del running[name]
          self.finish(run, stopped_by_us=False)
      prep_busy = self._poll_prepare(preparing)
      for job in todo:
        if job.name in started:
          continue
        left = (stop_at if job.resume == RERUN else lease_end) - now
        fits, need = self._fits(job, left, min_span)
        if not fits:
          call['skipped'][job.name] = (
            f'needs about {need:.0f} s, {max(left, 0):.0f} s left'
          )
          continue
        if job.prepare and job.prepare in prep_busy:
          if not job.shares:
            break  # the GPU waits for its data rather than for later jobs
          continue
        if not job.shares:
          if running:
            break  # it waits for the GPU; later jobs wait behind it
        else:
          exclusive = any(not r.job.shares for r in running.values())
          if exclusive or len(running) >= slots:
            break
          if job.spans and any(
            r.job.spans and r.job.task == job.task for r in running.values()
          ):
            continue
        call['skipped'].pop(job.name, None)
        self.restore(job)
        env = dict(base_env, **dict(job.env))
        if job.shares:  # several processes on one GPU
          env['XLA_PYTHON_CLIENT_PREALLOCATE'] = 'false'
        log = os.path.join(logs, job.name.replace('/', '__') + '.txt')
        running[job.name] = Running(job, self.workdir(job), log, env)
        started.add(job.name)
        call['started'].append(job.name)
        self.say(
          f'{job.name}: started ({need:.0f} s expected, '
          f'{stop_at - now:.0f} s left in this call)'
        )
        self.state.save()
        if not job.shares:
          break
      waiting = [j for j in todo if j.name not in started]
      startable = any(j.name not in call['skipped'] for j in waiting)
      if not running and not prep_busy and not startable:
        break
      time.sleep(poll)
    self._stop(running, preparing, kill_at)
    call['seconds'] = round(time.monotonic() - t0, 1)
    # Kept short: how many waited for a longer call, and the first of them.
    skipped = call.pop('skipped')
    call['skipped'] = len(skipped)
    if skipped:
      call['first_skipped'] = '{}: {}'.format(*next(iter(skipped.items())))
    self.state.save()
    return call

  def _stop(self, running, preparing, kill_at):
    for run in running.values():
      run.signalled = True
      run.signal(signal.SIGTERM)
      self.say(f'{run.job.name}: deadline, SIGTERM sent')
    for proc in preparing['procs']:
      if proc.poll() is None:
        try:
          os.killpg(proc.pid, signal.SIGTERM)
          proc.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
          pass
    for run in running.values():
      try:
        run.proc.wait(timeout=max(kill_at - time.monotonic(), 1))
      except subprocess.TimeoutExpired:
        run.signal(signal.SIGKILL)
        run.proc.wait()
      self.finish(run, stopped_by_us=True)
    self._poll_prepare(preparing)

  # --- data preparation: one command at a time, on the CPU, timed
  def _prepares(self, todo: list[Job]) -> dict:
    order = []
    for job in todo:
      if job.prepare and job.prepare not in order:
        order.append(job.prepare)
    return {'order': order, 'current': None, 'procs': []}

  def _poll_prepare(self, p: dict) -> set:
    """Advances the preparations; returns the commands not yet ended."""
    cur = p['current']
    if cur is not None and cur[1].poll() is not None:
      args, proc, start, log = cur
      seconds = time.monotonic() - start
      entry = {
        'command': ' '.join(['python', *args]),
        'seconds': round(seconds, 1),
        'exit': proc.returncode,
        'date': _now(),
        'device': self.device,
      }
      if proc.returncode:
        entry['error'] = error_line(log_tail(log), proc.returncode)
      self.state.prepare.append(entry)
      self.say(
        f'data: {entry["command"]} exit {proc.returncode}, {seconds:.0f} s'
      )
      p['current'] = cur = None
    if cur is None and p['order']:
      args = p['order'].pop(0)
      log = os.path.join(self.work, '_logs', 'prepare.txt')
      with open(log, 'a') as f:
        proc = subprocess.Popen(
          [sys.executable, *args],
          cwd=ROOT,
          stdout=f,
          stderr=subprocess.STDOUT,
          start_new_session=True,
        )
      p['procs'].append(proc)
      p['current'] = (args, proc, time.monotonic(), log)
    busy = set(p['order'])
    if p['current'] is not None:
      busy.add(p['current'][0])
    return busy


def run_queue(
  jobs: list[Job],
  archive: str,
  budget: float,
  *,
  work: str = WORK,
  name: str = 'reference',
  tarball: str | None = None,
  say=print,
  **kwargs,
) -> dict:
  """One call: runs the jobs that fit `budget` seconds, archives them,
  writes the tarball; returns the call's record (queue.json `calls`)."""
  if adopt_newer(archive, work, name):
    say(f'{archive}: replaced by the newer copy this machine kept')
  queue = Queue(jobs, archive, work, name, say=say)
  queue.state.save()
  call = queue.run(budget, **kwargs)
  keep_mirror(archive, work)
  if tarball:
    size = write_tarball(archive, tarball)
    say(f'wrote {tarball} ({size / 2**20:.2f} MiB)')
    if size > TARBALL_LIMIT_BYTES:
      say(
        f'warning: {tarball} is over 16 MiB: the device tool will not '
        'bring it back.'
      )
  return call


def plan_table(jobs: list[Job], archive: str, work: str, name: str) -> str:
  """--list: every job with its expected seconds and archive status."""
  state = State(archive, jobs, name)
  lines = [
    '| # | job | GPU | resume | expected s | spent s | status |',
    '|---|---|---|---|---|---|---|',
  ]
  for i, job in enumerate(jobs, 1):
    r = state.jobs[job.name]
    need = remaining_seconds(job, r, os.path.join(work, job.name))
    status = r['status'] + (
      f' (step {r["step"]})' if r['status'] == 'stopped' else ''
    )
    lines.append(
      f'| {i} | `{job.name}` | {"shares" if job.shares else "alone"} | '
      f'{job.resume}{" (spans leases)" if job.spans else ""} | '
      f'{job.seconds:.0f}'
      + (f' ({need:.0f} left)' if r['status'] == 'stopped' else '')
      + f' | {r.get("device_seconds", 0):.0f} | {status} |'
    )
  return '\n'.join(lines)


def parse_args(argv):
  p = argparse.ArgumentParser(
    prog='python -m experiments.reference.queue',
    description='Runs the next jobs of the reference queue that fit.',
  )
  p.add_argument('--budget', type=float, help="this call's seconds")
  p.add_argument(
    '--lease',
    type=float,
    help='seconds left in the lease, this call included (default: --budget); '
    'a job whose checkpoint stays on the machine starts when it fits this',
  )
  p.add_argument('--archive', default=None, help=f'default {ARCHIVE}')
  p.add_argument(
    '--work',
    help=f'work folder, not committed (default {WORK}; --tiny: {WORK}_tiny)',
  )
  p.add_argument('--tarball', help='also write the archive as this .tgz')
  p.add_argument('--tail', type=float, help='seconds kept after the deadline')
  p.add_argument('--slots', type=int, help='sharing jobs side by side')
  p.add_argument('--tiny', action='store_true', help='smoke scale, for a CPU')
  p.add_argument('--retry_failed', action='store_true')
  p.add_argument('--list', action='store_true', help='print the plan and exit')
  return p.parse_args(argv)


def main(argv=None) -> None:
  args = parse_args(sys.argv[1:] if argv is None else argv)
  try:
    jobs = queue_jobs.queue_jobs(tiny=args.tiny)
    work = args.work or (WORK + '_tiny' if args.tiny else WORK)
    archive = args.archive or (
      os.path.join(work, 'archive') if args.tiny else ARCHIVE
    )
    name = 'tiny' if args.tiny else 'reference'
    if args.list:
      print(plan_table(jobs, archive, work, name))
      return
    tail = args.tail if args.tail is not None else (10 if args.tiny else 30)
    slots = args.slots or (2 if args.tiny else 8)
    if args.budget is None:
      raise UserError('give --budget SECONDS (the seconds of this call).')
    if args.budget <= tail + ARCHIVE_RESERVE_S:
      raise UserError(
        f'--budget {args.budget:g} leaves nothing after the {tail:g} s tail '
        f'and {ARCHIVE_RESERVE_S} s for the archive; give more seconds.'
      )
    if slots < 1:
      raise UserError(f'--slots {slots} must be at least 1.')
    call = run_queue(
      jobs,
      archive,
      args.budget,
      work=work,
      name=name,
      tarball=args.tarball,
      lease=args.lease,
      tail=tail,
      slots=slots,
      retry_failed=args.retry_failed,
      poll=0.2 if args.tiny else 1.0,
    )
    print(
      f'{len(call["started"])} jobs started in {call["seconds"]:.0f} s; '
      f'archive: {archive}'
    )
  except UserError as e:
    print(f'error: {e}', file=sys.stderr)
    sys.exit(2)


if __name__ == '__main__':
  main()
