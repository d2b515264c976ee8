r"""A sweep's results, small enough to commit, that reports read as the sweep.

  python -m lra.sweep.archive --sweep runs/mqar/128x16 \
      --out experiments/mqar/runs/128x16

A sweep's run folders live where it ran (runs/ is not in git), and a fresh
machine has none of them: archive them before that machine goes. DST gets
SRC's sweep.json and, of each run it lists, the files the reports read
(config.json, results.json, metrics.jsonl, eval_*.json), none of the
checkpoints or logs (a 500-step MQAR run keeps about 5 kB). Each entry's
workdir becomes relative to DST, so `python -m experiments.mqar.report --sweeps
DST` reads DST wherever it lies, as it reads SRC.

Archiving into a DST that holds an earlier archive merges them: a run of
both keeps SRC's entry and files (the newer), a run of DST only is kept, and
DST's sweep.json lists every sweep command that wrote it. So one archive can
gather a grid run in pieces on machines that did not keep each other's runs.
"""

import glob
import os
import shutil
import sys
import tempfile

from absl import app, flags

from lra import commands
from lra.errors import UserError
from lra.sweep import runner as sweep_run
from lra.train import cli, rundir
from lra.train.metrics import write_json

# What a run folder keeps in an archive (everything a report reads).
KEPT = ('config.json', 'results.json', 'metrics.jsonl', 'eval_*.json')

FLAGS = flags.FLAGS


def _sweep_json(folder: str, what: str) -> dict:
  data = rundir.load_json(os.path.join(folder, 'sweep.json'))
  if not isinstance(data, dict) or not isinstance(data.get('runs'), list):
    raise UserError(
      f'{what} {folder}: no sweep.json with runs in it; give the --out '
      f'folder of a `{commands.program("sweep")}` run.'
    )
  return data


def resolve(folder: str, workdir: str | None) -> str | None:
  """A sweep.json entry's workdir: relative to `folder` where it lies
  there (an archive), else as written (a sweep's own, relative to where it
  ran)."""
  if workdir and not os.path.isabs(workdir):
    inside = os.path.join(folder, workdir)
    if os.path.isdir(inside):
      return inside
  return workdir


def _relative_name(entry: dict) -> str:
  """The run's folder inside an archive: its name in the sweep (the
  task/model-preset/grid path a sweep gives its run folders)."""
  name = entry['name']
  if os.path.isabs(name) or '..' in name.split(os.sep):
    raise UserError(f'sweep.json names a run {name!r}: not a relative name.')
  return name


def _nested(a: str, b: str) -> bool:
  """Whether real path `a` is `b` or lies inside it."""
  return a == b or a.startswith(b.rstrip(os.sep) + os.sep)


def _check_apart(src: str, dst: str, pairs: list[tuple[str, str]]) -> None:
  """Refuses, before anything is touched, an archive whose DST is its SRC
  (a symbolic link included), lies inside it or holds it, or whose run
  folder in DST would be one of the runs it copies (or hold one, or lie in
  one): archiving a run into itself deletes it."""
  real_src, real_dst = os.path.realpath(src), os.path.realpath(dst)
  if real_src == real_dst:
    raise UserError(f'--sweep and --out are both {src}; give another --out.')
  if _nested(real_dst, real_src) or _nested(real_src, real_dst):
    inner, outer = (
      ('--out', '--sweep') if _nested(real_dst, real_src) else
      ('--sweep', '--out')
    )  # fmt: skip
    raise UserError(
      f'--out {dst} and --sweep {src} overlap ({inner} lies inside '
      f'{outer}); give an --out folder outside the sweep.'
    )
  for source, target in pairs:
    real_source, real_target = (
      os.path.realpath(source),
      os.path.realpath(target),
    )
    if _nested(real_target, real_source) or _nested(real_source, real_target):
      raise UserError(
        f'--out {dst} would put run {target} on its own run folder '
        f"{source}; give an --out folder outside the sweep's runs."
      )


def _check_writable(dst: str) -> None:
  """Creates `dst` and writes a probe file in it, so a read-only or full
  folder is one sentence before any earlier archive there is touched."""
  try:
    os.makedirs(dst, exist_ok=True)
    fd, probe = tempfile.mkstemp(prefix='.archive-probe-', dir=dst)
    os.close(fd)
    os.remove(probe)
  except OSError as e:
    raise UserError(
      f'cannot write the archive into --out {dst}: '
      f'{e.strerror or e}; give a writable folder.'
    ) from None


def archive(src: str, dst: str) -> tuple[int, int]:
  """Archives sweep `src` into `dst` (module docstring); returns (runs
  copied from src, runs kept from an earlier archive in dst). Checks
  first (overlapping folders, a read-only DST), then copies each run into
  a fresh folder beside its place in DST and swaps it in, so a failure
  midway leaves each of DST's runs whole (the old or the new)."""
  if os.path.realpath(src) == os.path.realpath(dst):
    raise UserError(f'--sweep and --out are both {src}; give another --out.')
  data = _sweep_json(src, '--sweep')
  pairs = []
  for e in data['runs']:
    if 'name' not in e:
      continue
    name = _relative_name(e)
    pairs.append((e, resolve(src, e.get('workdir')), os.path.join(dst, name)))
  _check_apart(src, dst, [(s, t) for _, s, t in pairs if s])
  earlier = (
    _sweep_json(dst, '--out')
    if os.path.exists(os.path.join(dst, 'sweep.json'))
    else {}
  )
  _check_writable(dst)
  entries = sweep_run.earlier_entries(dst)
  copied = 0
  try:
    for e, source, target in pairs:
      fresh = target + '.archiving'
      if os.path.isdir(fresh):
        shutil.rmtree(fresh)
      os.makedirs(fresh)
      if source and os.path.isdir(source):
        for pattern in KEPT:
          for path in glob.glob(os.path.join(source, pattern)):
            shutil.copy2(path, fresh)
      if os.path.isdir(target):
        shutil.rmtree(target)
      os.replace(fresh, target)
      entries[e['name']] = dict(e, workdir=e['name'])
      copied += 1
    commands = list(earlier.get('commands') or [])
    for command in [earlier.get('command'), data.get('command')]:
      if command and command not in commands:
        commands.append(command)
    write_json(
      os.path.join(dst, 'sweep.json'),
      {'command': data.get('command'), 'commands': commands,
       'runs': list(entries.values())},
    )  # fmt: skip
  except OSError as e:
    for _, _, target in pairs:  # a half-copied run is not left behind
      shutil.rmtree(target + '.archiving', ignore_errors=True)
    raise UserError(
      f'archiving into {dst} stopped after {copied} runs: '
      f'{e.strerror or e} ({e.filename or dst}); free space or give another '
      '--out, then run the same command again.'
    ) from None
  return copied, len(entries) - copied


def main(argv: list[str]) -> None:
  try:
    if len(argv) > 1:
      raise UserError(f'Unexpected argument {argv[1]!r}; see --help.')
    if not FLAGS.sweep or not FLAGS.out:
      raise UserError('Give --sweep SRC (a sweep --out folder) and --out DST.')
    copied, kept = archive(FLAGS.sweep, FLAGS.out)
  except UserError as e:
    print(f'error: {e}', file=sys.stderr)
    sys.exit(2)
  more = f', kept {kept} of an earlier archive' if kept else ''
  print(f'Archived {copied} runs of {FLAGS.sweep} into {FLAGS.out}{more}.')


if __name__ == '__main__':
  # Defined here, not at import: mqar_report imports this module.
  flags.DEFINE_string(
    'sweep', None, 'The --out folder of a python -m lra.sweep run.'
  )
  flags.DEFINE_string(
    'out', None, 'The archive folder (merged with an earlier archive there).'
  )
  app.run(main, flags_parser=cli.parse_flags)
