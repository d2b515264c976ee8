"""Runs command lines of the project's scripts (`train.py ...`,
`-m lra.data.prepare ...`) as `python <args>` would, each in a forked child of
one process that imported JAX, Flax, Orbax and the project once: a case of
the CLI error table then costs its own work, not the 3-5 s of imports.

  python tests/forkrun.py JOBS.json RESULTS.json

JOBS.json: [{"args": [...], "env": {...}, "cwd": "..."}]; RESULTS.json:
[{"returncode", "stdout", "stderr"}] in the same order, two children at a
time. Each child sets its environment and argv, runs the script or module
as __main__ (runpy) and exits with its status, exactly as the interpreter
would: SystemExit's code, 1 with the traceback on stderr for an uncaught
exception. JAX's backends are never started in this parent (checked), so
the children start their own, as a fresh process does.
"""

import json
import os
import runpy
import sys
import tempfile
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# train.py, benchmark.py and lra.data.prepare with what they import (they define
# their flags only as __main__; eval.py defines its own on import, so it is
# not preloaded: what it imports is, through train).
PRELOAD = ('train', 'benchmark', 'lra.data.prepare')


def preload():
  sys.path.insert(0, ROOT)
  for name in PRELOAD:
    __import__(name)
  from jax._src import xla_bridge  # pylint: disable=g-import-not-at-top

  if xla_bridge._backends:  # pylint: disable=protected-access
    raise RuntimeError('a preloaded module started a JAX backend')


def child(job, out, err):
  """In the forked child: never returns."""
  code = 1
  try:
    os.chdir(job.get('cwd', ROOT))
    os.environ.clear()
    os.environ.update(job['env'])
    for fd, path in ((1, out), (2, err)):
      f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
      os.dup2(f, fd)
      os.close(f)
    args = job['args']
    try:
      if args[0] == '-m':
        sys.argv = [args[1], *args[2:]]
        runpy.run_module(args[1], run_name='__main__', alter_sys=True)
      else:
        sys.argv = list(args)
        sys.path[0] = os.path.dirname(os.path.abspath(args[0]))
        runpy.run_path(args[0], run_name='__main__')
      code = 0
    except SystemExit as e:
      if e.code is None:
        code = 0
      elif isinstance(e.code, int):
        code = e.code
      else:
        print(e.code, file=sys.stderr)
        code = 1
    except BaseException:  # pylint: disable=broad-except
      traceback.print_exc()
      code = 1
  finally:
    try:
      sys.stdout.flush()
      sys.stderr.flush()
    finally:
      os._exit(code)  # pylint: disable=protected-access


def run_all(jobs, parallel=2):
  tmp = tempfile.mkdtemp(prefix='forkrun_')
  running, results = {}, [None] * len(jobs)

  def reap():
    pid, status = os.wait()
    i, out, err = running.pop(pid)
    with open(out) as f_out, open(err) as f_err:
      results[i] = {
        'returncode': os.waitstatus_to_exitcode(status),
        'stdout': f_out.read(),
        'stderr': f_err.read(),
      }

  for i, job in enumerate(jobs):
    while len(running) >= parallel:
      reap()
    out, err = os.path.join(tmp, f'{i}.out'), os.path.join(tmp, f'{i}.err')
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
      child(job, out, err)
    running[pid] = (i, out, err)
  while running:
    reap()
  return results


def main():
  jobs_path, results_path = sys.argv[1:3]
  with open(jobs_path) as f:
    jobs = json.load(f)
  preload()
  with open(results_path, 'w') as f:
    json.dump(run_all(jobs), f)


if __name__ == '__main__':
  main()
