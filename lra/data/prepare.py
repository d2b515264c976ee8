"""Generates or converts one LRA task into its cache.

  python -m lra.data.prepare listops [--data_dir DIR] [--small] [--seed N]
  python -m lra.data.prepare pathfinder --option resolution=64 --option seed=1
  python -m lra.data.prepare pathx --option difficulty=easy
  python -m lra.data.prepare text --option val=heldout --force
  python -m lra.data.prepare image --download [--source tfds] [--mirror URL]

Synthetic tasks (listops, pathfinder, pathx) are generated; the others are
converted from release files under the data directory (a missing file stops
with a message naming it and where to put it). `--download` first fetches
them from their canonical URLs (lra/data/download.py: progress bar, resumable,
checked), or for pathfinder / pathx / listops extracts the LRA release's
files, which the preparation then prefers to generating. `--force` rebuilds
the cache; a damaged cache file is reported with the command that rebuilds
it.
"""

import argparse
import errno
import json
import logging
import os
import shutil
import sys
import time

from lra import commands
from lra import data as tasks
from lra.data import cache, download
from lra.data.dirs import check_dir
from lra.errors import UserError


def _value(text):
  """'3' -> 3, '0.5' -> 0.5, anything else stays a string."""
  for kind in (int, float):
    try:
      return kind(text)
    except ValueError:
      pass
  return text


def parse_options(args):
  """The task's data options from the parsed flags."""
  options = {}
  for item in args.option:
    key, sep, text = item.partition('=')
    if not sep or not key:
      raise UserError(f'--option {item!r} is not key=value; write e.g. seed=1.')
    options[key.strip()] = _value(text.strip())
  if args.small:
    if args.variant not in (None, 'small'):
      raise UserError('--small means --variant small; give only one of them.')
    args.variant = 'small'
  if args.variant is not None:
    options['variant'] = args.variant
  if args.seed is not None:
    options['seed'] = args.seed
  seed = options.get('seed')
  if seed is not None and (
    isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**32
  ):
    raise UserError(
      f'seed must be an integer in [0, 2**32), got {seed!r}; give e.g. '
      '--seed 1.'
    )
  return options


def command(task_name, data_dir, options):
  """The `lra-prepare ... --force` line that rebuilds it, spelt as it works
  where this program runs (lra/commands.py)."""
  parts = [commands.program('prepare'), task_name]
  if data_dir and os.path.abspath(data_dir) != os.path.abspath(
    tasks.default_data_dir()
  ):
    parts.append(f'--data_dir {data_dir}')
  defaults = dict(tasks.get_task(task_name).defaults)
  for key, value in sorted(options.items()):
    if key == 'variant':
      parts.append(f'--variant {value}')
    elif defaults.get(key) != value:
      parts.append(f'--option {key}={value}')
  return ' '.join(parts + ['--force'])


class _Parser(argparse.ArgumentParser):
  """argparse with its errors as one `error:` line (no usage dump)."""

  def error(self, message):
    print(f'error: {message}; see --help.', file=sys.stderr)
    sys.exit(2)


def build_parser():
  parser = _Parser(
    prog=commands.program('prepare'), description=__doc__.split('\n')[0]
  )
  parser.add_argument('task', help=f'one of: {", ".join(tasks.TASKS)}')
  parser.add_argument(
    '--data_dir', help='data root (default: $LRA_DATA_DIR or ~/lra_data)'
  )
  parser.add_argument('--variant', help="data variant, e.g. 'small'")
  parser.add_argument(
    '--small', action='store_true', help='shorthand for --variant small'
  )
  parser.add_argument('--seed', type=int, help='generator seed (default 0)')
  parser.add_argument(
    '--option',
    action='append',
    default=[],
    metavar='KEY=VALUE',
    help='another task data option (repeatable), e.g. resolution=32',
  )
  parser.add_argument(
    '--force', action='store_true', help='delete the cache and rebuild it'
  )
  parser.add_argument(
    '--download',
    action='store_true',
    help='fetch the release files first (resumable; lra/data/download.py)',
  )
  parser.add_argument(
    '--source',
    choices=('canonical', 'tfds'),
    default='canonical',
    help='with --download: the canonical URLs (default) or TensorFlow '
    'Datasets (text, image): a copy prepared in its data directory '
    '($TFDS_DATA_DIR, ~/tensorflow_datasets or DATA_DIR/TASK/'
    'tensorflow_datasets) is used as it is, else TFDS downloads it there '
    f'(needs {download.TFDS_PIP})',
  )
  parser.add_argument(
    '--mirror',
    help='with --download: fetch URL/<file name> instead (or '
    f'${download.MIRROR_ENV})',
  )
  return parser


def main(argv=None):
  args = build_parser().parse_args(argv)
  logging.basicConfig(level=logging.INFO, format='%(message)s')
  try:
    task = tasks.get_task(args.task)
    options = parse_options(args)
    if args.data_dir:
      data_dir, flag = args.data_dir, '--data_dir'
    else:
      data_dir, flag = tasks.default_data_dir(), 'LRA_DATA_DIR'
    check_dir(data_dir, flag, writable=False)
    if args.download:
      got = download.download(
        args.task, data_dir, options, args.source, args.mirror
      )
      print(f'{args.task}: {got}', flush=True)
    elif args.source != 'canonical' or args.mirror:
      raise UserError('--source and --mirror go with --download; add it.')
    path = task.cache_dir(data_dir, options)
    if args.force and os.path.exists(path):
      shutil.rmtree(path)
    start = time.time()
    was_ready = cache.is_complete(path)
    try:
      path = task.ensure_prepared(data_dir, options)
      counts = {s: len(cache.load_split(path, s)[1]) for s in cache.SPLITS}
    except cache.CacheError as e:
      rebuild = command(args.task, data_dir, options)
      raise UserError(f'{e}; rebuild the cache with `{rebuild}`.') from None
    except OSError as e:
      if e.errno == errno.ENOSPC:
        raise UserError(
          f'Cannot prepare the cache in {path}: no space left on device '
          f'(its unfinished files are removed); free some space or give '
          f'another {flag}.'
        ) from None
      where = f': {e.filename}' if e.filename else ''
      raise UserError(
        f'Cannot prepare the cache in {path} ({e.strerror or e}{where}); '
        f'give a {flag} you can write to.'
      ) from None
  except UserError as e:
    print(f'error: {e}', file=sys.stderr)
    return 2
  state = 'already prepared' if was_ready else 'prepared'
  print(f'{args.task}: {state} in {path}')
  print('  ' + ', '.join(f'{s} {n:,}' for s, n in counts.items()))
  info = _info(path)
  if info.get('source_path'):
    print(f'  from {info.get("source")} {info["source_path"]}')
  if args.download and args.source == 'tfds' and info.get('source') != 'tfds':
    print(
      f'  (data.source=auto takes the {info.get("source")} before TFDS; '
      'add --option source=tfds for a cache made from TFDS)'
    )
  print(f'  {time.time() - start:.1f} s')
  return 0


def _info(cache_dir):
  """The cache's info.json ({} when it has none)."""
  try:
    with open(os.path.join(cache_dir, 'info.json')) as f:
      info = json.load(f)
  except (OSError, ValueError):
    return {}
  return info if isinstance(info, dict) else {}


def run():
  """The command line (console script lra-prepare): Ctrl-C is one line,
  exit 130 (a cache is written to a temporary name and renamed, so an
  interrupted one is rebuilt next time)."""
  try:
    sys.exit(main())
  except KeyboardInterrupt:
    print('Interrupted.', file=sys.stderr)
    sys.exit(130)


if __name__ == '__main__':
  run()
