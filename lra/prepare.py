"""Generates or converts one LRA task into its cache.

  python -m lra.prepare listops [--data_dir DIR] [--small] [--seed N]
  python -m lra.prepare pathfinder --option resolution=32 --option hard=1

Synthetic tasks (listops, pathfinder, pathx) are generated; the others are
converted from release files under the data directory (a missing file stops
with a message naming it and where to put it). `--force` rebuilds the cache.
"""

import argparse
import logging
import os
import shutil
import sys
import time

from lra import cache, tasks
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
  return options


def main(argv=None):
  parser = argparse.ArgumentParser(
    prog='python -m lra.prepare', description=__doc__.split('\n')[0]
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
  args = parser.parse_args(argv)
  logging.basicConfig(level=logging.INFO, format='%(message)s')
  try:
    task = tasks.get_task(args.task)
    options = parse_options(args)
    data_dir = args.data_dir or tasks.default_data_dir()
    path = task.cache_dir(data_dir, options)
    if args.force and os.path.exists(path):
      shutil.rmtree(path)
    start = time.time()
    was_ready = cache.is_complete(path)
    path = task.ensure_prepared(data_dir, options)
    counts = {s: len(cache.load_split(path, s)[1]) for s in cache.SPLITS}
  except UserError as e:
    print(f'error: {e}', file=sys.stderr)
    return 2
  state = 'already prepared' if was_ready else 'prepared'
  print(f'{args.task}: {state} in {path}')
  print('  ' + ', '.join(f'{s} {n:,}' for s, n in counts.items()))
  print(f'  {time.time() - start:.1f} s')
  return 0


if __name__ == '__main__':
  sys.exit(main())
