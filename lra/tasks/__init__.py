"""The LRA tasks: their data, and the registry that knows them all.

This package holds the task data, apart from the training harness around it
(lra/) and the models (models/):

  listops.py         ListOps: generator of nested list operations, TSV reader
  text.py            byte-level IMDB (aclImdb tarball or TFDS files)
  retrieval.py       AAN document matching (the LRA release's TSVs)
  image.py           grayscale CIFAR-10 (python tarball or TFDS files)
  pathfinder.py      Pathfinder and Path-X: generated, or the LRA release
  pathfinder_gen.py  the Pathfinder image generator, vectorised over images
  tfrecord.py        TFRecord files read without TensorFlow
  release.py         where a converted task finds its release files
  cache.py           the per-split .npy caches every task is prepared into

and this registry: one `Task` per task name (listops, text, retrieval, image,
pathfinder, pathx), looked up as `tasks.get_task(name)` or `tasks.TASKS`.
Nothing here imports models/ or the training harness (lra.runtime, ...).

A task module (listops.py, text.py, ...) provides two functions:

  cache_name(options: dict) -> str
      A short name for the cache that these data options produce, e.g.
      'full' or 'small' for ListOps, '32_hard' for Pathfinder.
  prepare(cache_dir: str, data_dir: str, options: dict, progress: bool) -> None
      Generates (synthetic tasks) or converts (release files found under
      data_dir) the task into `lra.tasks.cache` splits in cache_dir. A
      converter whose sources are missing raises UserError naming the file
      to fetch and the exact place to put it.

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

from lra.errors import UserError
from lra.tasks import cache


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

  def transform(self, splits, options):
    """The module's `transform(splits, options)` (what the model reads,
    computed from the cached splits after loading), if it has one."""
    fn = getattr(self._module(), 'transform', None)
    return fn(splits, self.options(options)) if fn else splits

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
    Task('listops', 10, 16, 0, 1, True, 'lra.tasks.listops'),
    Task('text', 2, 257, 0, 1, False, 'lra.tasks.text'),
    Task('retrieval', 2, 257, 0, 2, False, 'lra.tasks.retrieval'),
    Task('image', 10, 256, None, 1, False, 'lra.tasks.image'),
    Task('pathfinder', 2, 256, None, 1, True, 'lra.tasks.pathfinder'),
    Task(
      'pathx',
      2,
      256,
      None,
      1,
      True,
      'lra.tasks.pathfinder',
      (('resolution', 128),),
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
