"""The LRA tasks: their data, and the registry that knows them all.

This package holds the task data, apart from the training harness around it
(lra/) and the models (models/):

  listops.py         ListOps: generator of nested list operations, TSV reader
  text.py            byte-level IMDB (aclImdb tarball or TFDS files)
  retrieval.py       AAN document matching (the LRA release's TSVs)
  image.py           grayscale CIFAR-10 (python tarball or TFDS files)
  pathfinder.py      Pathfinder and Path-X: generated, or the LRA release
  pathfinder_gen.py  the Pathfinder generator's snakes, vectorised over images
  pathfinder_draw.py   their pixels: paddles, markers, per-resolution tables
  pathfinder_release.py  the LRA release's Pathfinder files, read
  pathfinder_stats.py  statistics and examples of generated images (--stats)
  mqar.py            multi-query associative recall (Zoology), generated,
                     with a label per position
  tfrecord.py        TFRecord files read without TensorFlow
  release.py         where a converted task finds its release files
  cache.py           the per-split .npy caches every task is prepared into

and this registry: one `Task` per task name (listops, text, retrieval, image,
pathfinder, pathx, mqar), looked up as `tasks.get_task(name)` or
`tasks.TASKS`.
Nothing here imports models/ or the training harness (lra.train.runtime, ...).

A task module (listops.py, text.py, ...) provides two functions:

  cache_name(options: dict) -> str
      A short name for the cache that these data options produce, e.g.
      'full' or 'small' for ListOps, '32_hard' for Pathfinder.
  prepare(cache_dir: str, data_dir: str, options: dict, progress: bool) -> None
      Generates (synthetic tasks) or converts (release files found under
      data_dir) the task into `lra.data.cache` splits in cache_dir. A
      converter whose sources are missing raises UserError naming the file
      to fetch and the exact place to put it.

and may provide

  resolve(options: dict, data_dir: str) -> dict
      Settles the options that depend on the files under data_dir (Pathfinder
      turns source='auto' into 'release' or 'generate'), so the cache name
      says which data it holds.

A task with a label per position (Task.per_position: mqar; objective
'per_position', lra/train/objectives.py) caches labels int32 [N, L] (-100 where
a position is not labelled) and provides

  vocab_size(options) -> int   the ids the model reads (a data option)
  causal(options) -> bool      whether its model runs under a causal mask

and any task may provide

  extra_test_splits(options) -> {name: cache split}
      Test splits beyond train/val/test (mqar's data.test_splits), cached
      by `prepare` beside the others and evaluated at the end of a run on
      the best checkpoint (results.json `test_splits`).

`options` is the task config's `data` block as a dict.
"""

import dataclasses
import importlib
import os
import sys

from lra.data import cache
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
  # A label per position (mqar): labels [N, L], objective 'per_position'.
  per_position: bool = False

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

  # Per-position tasks and extra test splits (mqar; module docstring).
  def vocab_size_for(self, options):
    """The vocabulary of these data options (the module's `vocab_size`
    when it has one, else the task's)."""
    fn = getattr(self._module(), 'vocab_size', None)
    return fn(self.options(options)) if fn else self.vocab_size

  def causal_for(self, options):
    """Whether a per-position task's model is causal (module `causal`)."""
    return bool(self._module().causal(self.options(options)))

  def extra_test_splits(self, options):
    """{name: cache split} of the extra test splits ({} for most tasks)."""
    fn = getattr(self._module(), 'extra_test_splits', None)
    return fn(self.options(options)) if fn else {}

  def load_extra_test_splits(self, data_dir, options):
    """{name: (inputs, labels)} of the extra test splits, from the cache."""
    path = self.cache_dir(data_dir, options)
    return {
      name: cache.load_split(path, split)
      for name, split in self.extra_test_splits(options).items()
    }

  def cache_dir(self, data_dir, options):
    options = self.resolved(data_dir, options)
    return os.path.join(data_dir, self.name, self._module().cache_name(options))

  def ensure_prepared(self, data_dir, options, progress=True):
    """Returns the cache dir, preparing it first if it is incomplete. One
    process prepares a cache at a time (an advisory lock beside it, as
    sweeps with --jobs start several trainings of one task at once); the
    others wait, then find it complete. `progress`: progress bars on a
    terminal; on a file or a pipe one plain line instead (a bar there is
    carriage returns)."""
    options = self.resolved(data_dir, options)
    path = self.cache_dir(data_dir, options)
    extra = self.extra_test_splits(options).values()

    def ready():
      return cache.is_complete(path) and all(
        cache.has_split(path, s)
        for s in extra  # (mqar's extra test splits)
      )

    if ready():
      return path
    with cache.preparing(path, progress):
      if not ready():
        isatty = getattr(sys.stderr, 'isatty', None)
        bars = progress and bool(isatty and isatty())
        if progress and not bars:
          print(
            f'Preparing the {self.name} data in {path} ...',
            file=sys.stderr,
            flush=True,
          )
        try:
          self._module().prepare(path, data_dir, options, bars)
        except BaseException:  # a full disk, an error, Ctrl-C
          cache.remove_partial(path)
          raise
    return path


TASKS = {
  t.name: t
  for t in [
    Task('listops', 10, 16, 0, 1, True, 'lra.data.listops'),
    Task('text', 2, 257, 0, 1, False, 'lra.data.text'),
    Task('retrieval', 2, 257, 0, 2, False, 'lra.data.retrieval'),
    Task('image', 10, 256, None, 1, False, 'lra.data.image'),
    Task('pathfinder', 2, 256, None, 1, True, 'lra.data.pathfinder'),
    Task(
      'pathx',
      2,
      256,
      None,
      1,
      True,
      'lra.data.pathfinder',
      (('resolution', 128),),
    ),
    # Multi-query associative recall: labels per position; the vocabulary
    # (here Zoology's default 8,192, also the classes: a token per
    # position) is a data option (vocab_size_for).
    Task('mqar', 8192, 8192, 0, 1, True, 'lra.data.mqar', per_position=True),
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
