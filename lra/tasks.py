"""The task registry: one entry per LRA task, one place that knows them all.

A task module (lra/listops.py, lra/text.py, ...) provides two functions:

  cache_name(options: dict) -> str
      A short name for the cache that these data options produce, e.g.
      'full' or 'small' for ListOps, '32_hard' for Pathfinder.
  prepare(cache_dir: str, data_dir: str, options: dict, progress: bool) -> None
      Generates (synthetic tasks) or converts (release files found under
      data_dir) the task into `lra.cache` splits in cache_dir. A converter
      whose sources are missing raises UserError naming the file to fetch and
      the exact place to put it.

and may provide

  resolve(options: dict, data_dir: str) -> dict
      Settles the options that depend on the files under data_dir (Pathfinder
      turns source='auto' into 'release' or 'generate'), so the cache name
      says which data it holds.

`options` is the task config's `data` block as a dict.
"""

import dataclasses
import importlib
import os

from lra import cache
from lra.errors import UserError


@dataclasses.dataclass(frozen=True)
class Task:
  name: str
  num_classes: int
  vocab_size: int  # token ids are in [0, vocab_size)
  pad_id: int | None  # None: every token is real (pixels: black is not padding)
  num_inputs: int  # 2 for retrieval (two documents per example)
  generated: bool  # True: train.py generates the data when it is missing
  module: str
  # Data options this task implies (pathx = Pathfinder at 128 px); options
  # given by a config or the command line override them.
  defaults: tuple = ()

  def _module(self):
    return importlib.import_module(self.module)

  def options(self, options):
    return {**dict(self.defaults), **options}

  def resolved(self, data_dir, options):
    """The options with the defaults and the module's `resolve` applied."""
    options = self.options(options)
    resolve = getattr(self._module(), 'resolve', None)
    return resolve(options, data_dir) if resolve and data_dir else options

  def cache_dir(self, data_dir, options):
    options = self.resolved(data_dir, options)
    return os.path.join(data_dir, self.name, self._module().cache_name(options))

  def ensure_prepared(self, data_dir, options, progress=True):
    """Returns the cache dir, preparing it first if it is incomplete."""
    options = self.resolved(data_dir, options)
    path = self.cache_dir(data_dir, options)
    if not cache.is_complete(path):
      self._module().prepare(path, data_dir, options, progress)
    return path


TASKS = {
  t.name: t
  for t in [
    Task('listops', 10, 16, 0, 1, True, 'lra.listops'),
    Task('text', 2, 257, 0, 1, False, 'lra.text'),
    Task('retrieval', 2, 257, 0, 2, False, 'lra.retrieval'),
    Task('image', 10, 256, None, 1, False, 'lra.image'),
    Task('pathfinder', 2, 256, None, 1, True, 'lra.pathfinder'),
    Task(
      'pathx', 2, 256, None, 1, True, 'lra.pathfinder', (('resolution', 128),)
    ),
  ]
}


def get_task(name):
  if name not in TASKS:
    raise UserError(f'Unknown task {name!r}; known tasks: {", ".join(TASKS)}.')
  return TASKS[name]


def default_data_dir():
  return os.environ.get('LRA_DATA_DIR') or os.path.join(
    os.path.expanduser('~'), 'lra_data'
  )
