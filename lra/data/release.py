"""Where a converted task finds its release files: one search for the tasks
that come as an archive, its unpacked folder, or a TFDS prepared dir (text,
image)."""

import os

from lra.data import tfrecord
from lra.errors import UserError

SOURCES = ('auto', 'archive', 'folders', 'tfds')


def check_source(source):
  if source not in SOURCES:
    raise UserError(
      f'Unknown data.source {source!r}; use one of {", ".join(SOURCES)}.'
    )
  return source


def find(source, paths, readers, *, dataset, tfds_name, archive, url):
  """The first source present, read: (source name, its path, data).

  Args:
    source: 'auto' (archive, then folders, then tfds) or one of them.
    paths: {'archive': file, 'folders': dir, 'tfds': TFDS dataset dir}.
    readers: {'archive': f(path), 'folders': f(path), 'tfds': f(files)}.
    dataset, tfds_name, archive, url: names for the message when none is
      there (e.g. 'IMDB', 'imdb_reviews', 'aclImdb_v1.tar.gz', its URL).
  """
  wanted = SOURCES[1:] if source == 'auto' else (source,)
  for name in wanted:
    path = paths[name]
    if name == 'archive' and os.path.isfile(path):
      return name, path, readers[name](path)
    if name == 'folders' and os.path.isdir(path):
      return name, path, readers[name](path)
    if name == 'tfds':
      files = tfrecord.tfds_files(path, tfds_name, ('train', 'test'))
      if files:
        return name, path, readers[name](files)
  if source == 'tfds':
    raise UserError(
      f'No TFDS {tfds_name} found: put the prepared {tfds_name}-'
      f'{{train,test}}.tfrecord-* files in {paths["tfds"]}/<version>/.'
    )
  raise UserError(
    f'No {dataset} source found: download {archive} ({url}) and put it at '
    f'{paths["archive"]}, or unpack it there.'
  )
