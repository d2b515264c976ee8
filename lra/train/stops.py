"""How a run stops on a signal: Ctrl-C, SIGTERM (preemption) and SIGHUP (a
closed terminal) at any stage of train.py end with one line saying what is
kept and the command that resumes, and that command ends as an
uninterrupted run would.

  start-up (flags, imports)   lra/train/interrupt.py: nothing written yet
  restore, data, model        stop_anywhere: Stopped, then exit_stopped
  the training loop           stop_requests: the step ends, a checkpoint is
  (compile, steps, val, save)  saved, then exit_interrupted (a second
                              Ctrl-C: at once, the last complete save kept)
  the final test, results     stop_anywhere: the test runs again on resuming
"""

import contextlib
import os
import shlex
import signal
import sys
import threading

from lra import commands
from lra.train import rundir

# Signals that stop a run: Ctrl-C, SIGTERM (preemption: TPU/cloud VMs,
# Slurm, Kubernetes end runs so) and SIGHUP (the terminal or ssh session
# closed). In the loop they ask it to stop at the end of its step and save
# (stop_requests); anywhere else in the run they stop it at once
# (stop_anywhere), and each ends with one line: what is kept and the
# command that resumes.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# How each is named in that line.
STOP_NAMES = {
  signal.SIGINT: 'Interrupted',
  signal.SIGTERM: 'Preempted (SIGTERM)',
  signal.SIGHUP: 'Hung up (SIGHUP)',
}


class Stopped(KeyboardInterrupt):
  """A stop signal outside the loop's own handling (start-up, the final
  test, results.json): a KeyboardInterrupt, so no `except Exception` on
  the way swallows it."""

  def __init__(self, signum: int):
    super().__init__(signum)
    self.signum = signum


@contextlib.contextmanager
def stop_anywhere():
  """For the block, a stop signal raises Stopped(signum) in the main thread
  (elsewhere nothing is set)."""
  if threading.current_thread() is not threading.main_thread():
    yield
    return

  def raise_stop(signum, frame):
    del frame
    raise Stopped(signum)

  previous = {s: signal.signal(s, raise_stop) for s in STOP_SIGNALS}
  try:
    yield
  finally:
    for s, handler in previous.items():
      signal.signal(s, handler)


def resume_command() -> str:
  """The command that resumes this run: this process's own command line,
  spelt to work from the working directory (lra/commands.py)."""
  return f'{commands.program("train")} {shlex.join(sys.argv[1:])}'.strip()


def exit_stopped(signum: int, workdir: str, stage: str) -> None:
  """The line for a run stopped outside the loop (what is kept, the command
  that resumes), then exit 128 + the signal's number."""
  step = rundir.latest_step(workdir) if os.path.isdir(workdir) else 0
  kept = (
    f'latest checkpoint: step {step}'
    if step
    else 'latest checkpoint: none yet (nothing of the run is lost)'
  )
  print(
    f'{STOP_NAMES.get(signum, f"Stopped (signal {signum})")} {stage}; '
    f'{kept}. Run the same command to resume: {resume_command()}',
    file=sys.stderr,
    flush=True,
  )
  sys.exit(128 + signum)


@contextlib.contextmanager
def stop_requests():
  """A list that gets the signal's number when Ctrl-C, SIGTERM or SIGHUP
  asks to stop: the loop then ends at the end of its current step, saves (the
  checkpoint there resumes exactly) and exits; a second Ctrl-C interrupts
  at once (exit 130, no traceback). Signal handlers can only be set in
  the main thread; elsewhere
  the list stays empty."""
  requested = []

  def request_stop(signum, frame):
    del frame
    requested.append(signum)
    if signum == signal.SIGINT:
      signal.signal(signal.SIGINT, stop_now)

  def stop_now(signum, frame):
    # A second Ctrl-C: stop at once, without a traceback. A save in flight
    # is written to a temporary folder first, so the previous checkpoint
    # stays whole; the same command resumes from it.
    del signum, frame
    print(
      '\nStopped at once (a second Ctrl-C); the latest complete checkpoint '
      f'is kept. Run the same command to resume: {resume_command()}',
      file=sys.stderr,
      flush=True,
    )
    os._exit(130)  # pylint: disable=protected-access

  if threading.current_thread() is not threading.main_thread():
    yield requested
    return
  previous = {s: signal.signal(s, request_stop) for s in STOP_SIGNALS}
  try:
    yield requested
  finally:
    for s, handler in previous.items():
      signal.signal(s, handler)


def exit_interrupted(last_good: int, signum: int) -> None:
  """Says where the latest checkpoint is and the command that resumes, and
  exits 128 + the signal's number (130 Ctrl-C, 143 SIGTERM, 129 SIGHUP)."""
  where = f'step {last_good}' if last_good else 'no checkpoint yet'
  print(
    f'{STOP_NAMES.get(signum, "Interrupted")}; latest checkpoint: {where}. '
    f'Run the same command to resume: {resume_command()}',
    file=sys.stderr,
  )
  sys.exit(128 + signum)
