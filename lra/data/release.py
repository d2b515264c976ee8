"""Where a converted task finds its release files: one search for the tasks
that come as an archive, its unpacked folder, or a TFDS prepared dir (text,
image).

The TFDS data directory of a task is, as TensorFlow Datasets would look:
$TFDS_DATA_DIR when set; else ~/tensorflow_datasets when it holds a
prepared copy of the dataset; else `<data_dir>/<task>/tensorflow_datasets`.
`python -m lra.data.prepare <task> --download --source tfds` prepares into
that same directory, and only when it holds no prepared copy.
"""

import logging
import os

from lra import commands
from lra.data import tfrecord
from lra.errors import UserError

SOURCES = ('auto', 'archive', 'folders', 'tfds')
TFDS_ENV = 'TFDS_DATA_DIR'
# Each task's TFDS dataset: its name (also the shards' file prefix) and
# its folder under a TFDS data directory (<name>[/<config>]).
TFDS_DATASETS = {
  'text': ('imdb_reviews', os.path.join('imdb_reviews', 'plain_text')),
  'image': ('cifar10', 'cifar10'),
}
TFDS_SPLITS = ('train', 'test')

log = logging.getLogger(__name__)


def check_source(source):
  if source not in SOURCES:
    raise UserError(
      f'Unknown data.source {source!r}; use one of {", ".join(SOURCES)}.'
    )
  return source


def home_tfds_dir():
  """TensorFlow Datasets' own default data directory."""
  return os.path.join(os.path.expanduser('~'), 'tensorflow_datasets')


def tfds_prepared(root, task):
  """{split: shard paths} of the task's prepared TFDS dataset under the TFDS
  data directory `root` (dataset_info.json and every split's shards, in
  any version folder, the newest first), or None."""
  name, folder = TFDS_DATASETS[task]
  return tfrecord.tfds_files(os.path.join(root, folder), name, TFDS_SPLITS)


def tfds_data_dir(data_dir, task):
  """(the task's TFDS data directory, why that one, for messages):
  $TFDS_DATA_DIR when set, else ~/tensorflow_datasets when it holds the
  dataset, else `<data_dir>/<task>/tensorflow_datasets`."""
  env = os.environ.get(TFDS_ENV)
  if env:
    return os.path.abspath(os.path.expanduser(env)), f'from ${TFDS_ENV}'
  home = home_tfds_dir()
  if tfds_prepared(home, task):
    return home, "TFDS's default, which holds it"
  root = os.path.join(data_dir, task, 'tensorflow_datasets')
  return root, f'default: ${TFDS_ENV} unset, none in {home}'


def tfds_layout(task):
  """What a prepared copy is, relative to its TFDS data directory (for
  messages)."""
  name, folder = TFDS_DATASETS[task]
  return (
    f'{folder}/<version>/ with dataset_info.json and the '
    f'{name}-{{{",".join(TFDS_SPLITS)}}}.tfrecord-* shards'
  )


def find(source, paths, readers, *, task, data_dir, dataset, archive, url):
  """The first source present, read: (source name, its path, data).

  Args:
    source: 'auto' (archive, then folders, then tfds) or one of them.
    paths: {'archive': file, 'folders': dir}; the tfds one is the task's
      TFDS data directory (tfds_data_dir).
    readers: {'archive': f(path), 'folders': f(path), 'tfds': f(files)},
      files as tfds_prepared returns them.
    task, data_dir: the task ('text', 'image') and the data root.
    dataset, archive, url: names for the message when none is there (e.g.
      'IMDB', 'aclImdb_v1.tar.gz', its URL).
  """
  wanted = SOURCES[1:] if source == 'auto' else (source,)
  for name in wanted:
    if name == 'archive' and os.path.isfile(paths[name]):
      return name, paths[name], readers[name](paths[name])
    if name == 'folders' and os.path.isdir(paths[name]):
      return name, paths[name], readers[name](paths[name])
    if name == 'tfds':
      root, why = tfds_data_dir(data_dir, task)
      files = tfds_prepared(root, task)
      if files:
        path = os.path.dirname(files[TFDS_SPLITS[0]][0])
        log.info('Reading TFDS %s from %s (%s).', dataset, path, why)
        return name, path, readers[name](files)
  if source == 'tfds':
    raise UserError(
      f'No prepared TFDS {TFDS_DATASETS[task][0]} in {root} ({why}): it '
      f'needs {tfds_layout(task)}; run `{commands.program("prepare")} '
      f'{task} --download --source tfds`, or set ${TFDS_ENV} to the TFDS data '
      'directory that holds it.'
    )
  fetch = commands.command(
    'prepare', task, '--download', '--data_dir', data_dir
  )
  raise UserError(
    f'No {dataset} source found: download {archive} ({url}) and put it at '
    f'{paths["archive"]}, or unpack it there (or run `{fetch}`).'
  )
