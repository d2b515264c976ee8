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

from absl import app, flags

from lra.errors import UserError
from lra.sweep import runner as sweep_run
from lra.train import cli, rundir
from lra.train.metrics import write_json

# What a run folder keeps in an archive (everything a report reads).
KEPT = ('config.json', 'results.json', 'metrics.jsonl', 'eval_*.json')

FLAGS = flags.FLAGS


def _sweep_json(folder: str, what: str) -> dict:
  data = rundir.read_json(os.path.join(folder, 'sweep.json'))
  if not isinstance(data, dict) or not isinstance(data.get('runs'), list):
    raise UserError(
      f'{what} {folder}: no sweep.json with runs in it; give the --out '
      'folder of a python -m lra.sweep run.'
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


def archive(src: str, dst: str) -> tuple[int, int]:
  """Archives sweep `src` into `dst` (module docstring); returns (runs
  copied from src, runs kept from an earlier archive in dst)."""
  if os.path.abspath(src) == os.path.abspath(dst):
    raise UserError(f'--sweep and --out are both {src}; give another --out.')
  data = _sweep_json(src, '--sweep')
  earlier = (
    _sweep_json(dst, '--out')
    if os.path.exists(os.path.join(dst, 'sweep.json'))
    else {}
  )
  entries = sweep_run.earlier_entries(dst)
  copied = 0
  for e in data['runs']:
    if 'name' not in e:
      continue
    name = _relative_name(e)
    source = resolve(src, e.get('workdir'))
    target = os.path.join(dst, name)
    if os.path.isdir(target):
      shutil.rmtree(target)
    os.makedirs(target)
    if source and os.path.isdir(source):
      for pattern in KEPT:
        for path in glob.glob(os.path.join(source, pattern)):
          shutil.copy2(path, target)
    entries[name] = dict(e, workdir=name)
    copied += 1
  commands = list(earlier.get('commands') or [])
  for command in [earlier.get('command'), data.get('command')]:
    if command and command not in commands:
      commands.append(command)
  os.makedirs(dst, exist_ok=True)
  write_json(
    os.path.join(dst, 'sweep.json'),
    {'command': data.get('command'), 'commands': commands,
     'runs': list(entries.values())},
  )  # fmt: skip
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
