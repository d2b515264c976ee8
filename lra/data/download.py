"""Fetches a task's release files from their canonical URLs.

  python -m lra.data.prepare text --download       # IMDB aclImdb_v1.tar.gz
  python -m lra.data.prepare image --download      # CIFAR-10 python tarball
  python -m lra.data.prepare retrieval --download  # from the LRA release
  python -m lra.data.prepare pathfinder --download [--option difficulty=easy]
  python -m lra.data.prepare pathx --download
  python -m lra.data.prepare text --download --source tfds  # TFDS's own

`--source tfds` (text, image) takes the TFDS data directory the readers
read (lra/data/release.py: $TFDS_DATA_DIR if set, else ~/tensorflow_datasets
when it holds the dataset, else `<data_dir>/<task>/tensorflow_datasets`): a
prepared copy there is used as it is and nothing is downloaded; without one,
TFDS's own download_and_prepare writes it there (`pip install -e '.[tfds]'`).

Transfers show a progress bar and resume: a transfer cut short leaves
`<file>.part`, and the next attempt (automatic, or the same command again)
asks the server for the rest with an HTTP Range request. A finished file is
checked against its known size and, where one is known, its SHA-256 (IMDB,
CIFAR-10, as TFDS records them) and MD5 (CIFAR-10, published on its page);
the LRA release archive (several GB) has no published checksum, so only its
size as the server reports it is checked. A file that fails a check is kept
aside as `<file>.bad` and the command stops with one sentence.

IMDB and CIFAR-10 go where their readers look, kept as archives
(`<data_dir>/text/aclImdb_v1.tar.gz`, `<data_dir>/image/cifar-10-python.
tar.gz`). The LRA release archive goes to `<data_dir>/downloads/
lra_release.gz` (kept, so the next task does not fetch it again); only the
members a task needs are extracted from it, streaming through the gzip once:
`tsv_data/new_aan_pairs.*.tsv` into `<data_dir>/retrieval/`, the
`pathfinder<R>/<difficulty folder>/` of the task's options into
`<data_dir>/<task>/release/` (lra/data/pathfinder.py),
`listops-1000/basic_*.tsv` into `<data_dir>/listops/release/`.

`LRA_DOWNLOAD_MIRROR=URL` (or `--mirror URL`) fetches `URL/<file name>`
instead of the canonical URL (a local copy, a proxy, the tests' loopback
server); the same checks apply.
"""

import dataclasses
import hashlib
import http.client
import importlib.util
import os
import re
import shutil
import socket
import sys
import tarfile
import urllib.error
import urllib.parse
import urllib.request
import zlib

import tqdm

from lra import data as tasks
from lra.data import pathfinder, release
from lra.errors import UserError

MIRROR_ENV = 'LRA_DOWNLOAD_MIRROR'
_CHUNK = 1 << 20
_TIMEOUT_S = 60
_ATTEMPTS = 4  # one transfer and up to three resumed ones


@dataclasses.dataclass(frozen=True)
class Source:
  """One downloadable file: its name, canonical URL and known checks."""

  name: str
  url: str
  size: int | None = None
  sha256: str | None = None
  md5: str | None = None


SOURCES = {
  'imdb': Source(
    'aclImdb_v1.tar.gz',
    'https://ai.stanford.edu/~amaas/data/sentiment/aclImdb_v1.tar.gz',
    size=84_125_825,
    sha256='c40f74a18d3b61f90feba1e17730e0d38e8b97c05fde7008942e91923d1658fe',
  ),
  'cifar10': Source(
    'cifar-10-python.tar.gz',
    'https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz',
    size=170_498_071,
    sha256='6d958be074577803d12ecdefd02955f39262c83c16fe9348329d7fe0b5c001ce',
    md5='c58f30108f718f92721af3b95e74349a',
  ),
  'lra_release': Source(
    'lra_release.gz',
    'https://storage.googleapis.com/long-range-arena/lra_release.gz',
  ),
}
# The file each task downloads.
TASK_SOURCES = {
  'text': 'imdb',
  'image': 'cifar10',
  'retrieval': 'lra_release',
  'pathfinder': 'lra_release',
  'pathx': 'lra_release',
  'listops': 'lra_release',
}


class _Cut(Exception):
  """The transfer stopped before the end (connection closed or reset)."""


# --------------------------------------------------------------- transfer


def _url(source, mirror):
  mirror = mirror or os.environ.get(MIRROR_ENV)
  if mirror:
    return mirror.rstrip('/') + '/' + source.name
  return source.url


def _digest(path, algorithm):
  h = hashlib.new(algorithm)
  with open(path, 'rb') as f:
    for block in iter(lambda: f.read(_CHUNK), b''):
      h.update(block)
  return h.hexdigest()


def _problem(path, source, expected_size):
  """None when the file passes the known checks, else what is wrong."""
  size = os.path.getsize(path)
  if expected_size is not None and size != expected_size:
    return f'has {size:,} bytes, expected {expected_size:,}'
  for algorithm, label in (('sha256', 'SHA-256'), ('md5', 'MD5')):
    want = getattr(source, algorithm)
    if want:
      got = _digest(path, algorithm)
      if got != want:
        return f'has {label} {got}, expected {want}'
  return None


def _total_size(response, offset):
  """The whole file's size from a 200 or 206 response, or None."""
  if response.status == 206:
    match = re.search(r'/(\d+)\s*$', response.headers.get('Content-Range', ''))
    return int(match.group(1)) if match else None
  length = response.headers.get('Content-Length')
  return int(length) if length and length.isdigit() else None


def _transfer(url, part, progress, name):
  """Appends the rest of `url` to `part` (a Range request when `part` has
  bytes); returns the file's total size as the server gave it, or None.
  Raises _Cut when the connection ends early."""
  offset = os.path.getsize(part) if os.path.exists(part) else 0
  request = urllib.request.Request(url, headers={'User-Agent': 'lra-jax'})
  if offset:
    request.add_header('Range', f'bytes={offset}-')
  try:
    response = urllib.request.urlopen(request, timeout=_TIMEOUT_S)
  except urllib.error.HTTPError as e:
    if e.code == 416 and offset:  # nothing left to send: it is all here
      return None
    raise
  with response:
    total = _total_size(response, offset)
    if response.status != 206:  # the server sent it all again
      offset = 0
    with (
      open(part, 'ab' if offset else 'wb') as f,
      tqdm.tqdm(
        total=total,
        initial=offset,
        unit='B',
        unit_scale=True,
        unit_divisor=1024,
        desc=name,
        disable=not progress,
      ) as bar,
    ):
      try:
        for block in iter(lambda: response.read(_CHUNK), b''):
          f.write(block)
          bar.update(len(block))
      except (http.client.IncompleteRead, ConnectionError, socket.timeout):
        raise _Cut() from None
    if total is not None and os.path.getsize(part) < total:
      raise _Cut()
  return total


def fetch(source, dest, mirror=None, progress=True):
  """Downloads `source` to `dest` (resuming `dest`.part), checks it and
  returns `dest`; a `dest` already there that passes the checks is kept."""
  if os.path.isfile(dest) and _problem(dest, source, source.size) is None:
    return dest
  url = _url(source, mirror)
  part, total = dest + '.part', None
  os.makedirs(os.path.dirname(os.path.abspath(dest)), exist_ok=True)
  for attempt in range(_ATTEMPTS):
    try:
      total = _transfer(url, part, progress, source.name) or total
      break
    except _Cut:
      if attempt == _ATTEMPTS - 1:
        have = os.path.getsize(part)
        raise UserError(
          f'The download of {url} stopped {_ATTEMPTS} times (last at '
          f'{have:,} bytes, kept in {part}); run the same command again to '
          f'resume, or download it yourself and put it at {dest}.'
        ) from None
    except (urllib.error.URLError, OSError, http.client.HTTPException) as e:
      reason = getattr(e, 'reason', None) or getattr(e, 'strerror', None) or e
      host = urllib.parse.urlsplit(url).netloc
      raise UserError(
        f'Cannot download {url} from {host} ({reason}); download it yourself '
        f'and put it at {dest}, then run the same command again.'
      ) from None
  problem = _problem(part, source, source.size or total)
  if problem:
    bad = dest + '.bad'
    os.replace(part, bad)
    raise UserError(
      f'The downloaded {source.name} {problem}, so it was kept aside as '
      f'{bad}; run the same command again to fetch it anew, or put a copy '
      f'you trust at {dest}.'
    )
  os.replace(part, dest)
  return dest


# ------------------------------------------------------------- extraction


def _pathfinder_folder(task, options):
  o = pathfinder._options(tasks.get_task(task).options(options))
  return o['resolution'], pathfinder.RELEASE_FOLDERS[o['difficulty']]


def release_members(task, options):
  """(pattern over member names, what to name it under the destination,
  the destination folder relative to the data dir) of one task."""
  if task == 'retrieval':
    pattern = r'(?:.*/)?tsv_data/(new_aan_pairs\.(?:train|eval|test)\.tsv)'
    return re.compile(pattern), 'retrieval'
  if task == 'listops':
    pattern = r'(?:.*/)?listops-1000/(basic_(?:train|val|test)\.tsv)'
    return re.compile(pattern), os.path.join('listops', 'release')
  resolution, folder = _pathfinder_folder(task, options)
  sub = f'pathfinder{resolution}/{folder}'
  pattern = rf'(?:.*/)?({re.escape(sub)}/(?:metadata|imgs)/.+)'
  return re.compile(pattern), os.path.join(task, 'release')


def _safe(name):
  parts = name.split('/')
  return '..' not in parts and not name.startswith('/')


def extract(archive, task, options, data_dir, progress=True):
  """Extracts this task's members of the LRA release archive, reading it as
  one stream (nothing else is unpacked); returns the destination folder.

  Members are written under a temporary folder and moved into place once
  the whole archive has been read, so an interrupted extraction never
  leaves a half folder that a reader would take for the release."""
  pattern, rel = release_members(task, options)
  dest = os.path.join(data_dir, rel)
  tmp = dest + '.extracting'
  shutil.rmtree(tmp, ignore_errors=True)
  written = []
  try:
    with (
      open(archive, 'rb') as raw,
      tqdm.tqdm(
        total=os.path.getsize(archive),
        unit='B',
        unit_scale=True,
        unit_divisor=1024,
        desc=f'reading {os.path.basename(archive)}',
        disable=not progress,
      ) as bar,
    ):
      with tarfile.open(fileobj=raw, mode='r|*') as tar:
        for member in tar:
          bar.update(raw.tell() - bar.n)
          match = pattern.fullmatch(member.name)
          if not (match and member.isfile() and _safe(match.group(1))):
            continue
          out = os.path.join(tmp, match.group(1))
          os.makedirs(os.path.dirname(out), exist_ok=True)
          with tar.extractfile(member) as src, open(out, 'wb') as f:
            shutil.copyfileobj(src, f, _CHUNK)
          written.append(match.group(1))
  except (tarfile.TarError, EOFError, zlib.error, OSError) as e:
    shutil.rmtree(tmp, ignore_errors=True)
    if isinstance(e, OSError) and e.filename:  # writing, not reading
      raise UserError(
        f'Cannot write {e.filename} ({e.strerror}); free space or give a '
        '--data_dir you can write to.'
      ) from None
    raise UserError(
      f'{archive} is not a readable tar archive ({e}); delete it and run the '
      'same command again to download it anew.'
    ) from None
  if not written:
    shutil.rmtree(tmp, ignore_errors=True)
    raise UserError(
      f'{archive} holds no member matching {pattern.pattern}; is it the LRA '
      'release (lra_release.gz)?'
    )
  os.makedirs(dest, exist_ok=True)
  for top in sorted({w.split('/')[0] for w in written}):
    target = os.path.join(dest, top)
    if os.path.isdir(target):
      # A pathfinder<R>/ folder may hold other difficulties: merge into it.
      for root, _, files in os.walk(os.path.join(tmp, top)):
        sub = os.path.relpath(root, tmp)
        os.makedirs(os.path.join(dest, sub), exist_ok=True)
        for name in files:
          os.replace(os.path.join(root, name), os.path.join(dest, sub, name))
    else:
      os.replace(os.path.join(tmp, top), target)
  shutil.rmtree(tmp, ignore_errors=True)
  return dest


# ------------------------------------------------------------------- tfds

# What `--source tfds` imports, and the pip package that installs each:
# tensorflow-datasets 4.9 imports importlib_resources without declaring it.
TFDS_PACKAGES = (
  ('tensorflow_datasets', 'tensorflow-datasets'),
  ('tensorflow', 'tensorflow-cpu'),
  ('importlib_resources', 'importlib_resources'),
)
TFDS_PIP = "pip install -e '.[tfds]'"
# The canonical archive each TFDS dataset is made from (for messages).
_TFDS_ARCHIVES = {'text': 'imdb', 'image': 'cifar10'}


def _installed(module):
  """Whether `module` would import, without importing it."""
  if module in sys.modules:
    return sys.modules[module] is not None
  try:
    return importlib.util.find_spec(module) is not None
  except (ImportError, ValueError):
    return False


def _first_line(e):
  text = str(e).strip().splitlines()
  text = text[0] if text else ''
  text = text if len(text) <= 200 else text[:197] + '...'
  return f'{type(e).__name__}: {text}' if text else type(e).__name__


def tfds_download(task, data_dir):
  """Makes the task's TFDS dataset ready where the readers look for it
  (release.tfds_data_dir: $TFDS_DATA_DIR, ~/tensorflow_datasets when it
  holds it, else `<data_dir>/<task>/tensorflow_datasets`); returns a line
  saying what was done.

  A prepared copy there is read in place; only when there is none does
  TensorFlow Datasets download and prepare it, into that directory
  (`tfds.builder(name, data_dir=...).download_and_prepare()`). Reading it
  needs no TensorFlow."""
  if task not in release.TFDS_DATASETS:
    raise UserError(
      f'--source tfds covers {" and ".join(release.TFDS_DATASETS)}; {task} '
      'comes from the LRA release: drop --source tfds.'
    )
  name, folder = release.TFDS_DATASETS[task]
  root, why = release.tfds_data_dir(data_dir, task)
  if release.tfds_prepared(root, task):
    return f'TFDS {name} already prepared in {root} ({why}); nothing fetched'
  canonical = SOURCES[_TFDS_ARCHIVES[task]].name
  missing = [p for m, p in TFDS_PACKAGES if not _installed(m)]
  if missing:
    names = ', '.join(missing[:-1]) + ' and ' * (len(missing) > 1)
    verb = 'is' if len(missing) == 1 else 'are'
    raise UserError(
      f'--source tfds needs {names}{missing[-1]}, which {verb} not '
      f'installed: run {TFDS_PIP} (or pip install '
      f'{" ".join(p for _, p in TFDS_PACKAGES)}), or drop --source tfds to '
      f'fetch {canonical} instead.'
    )
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '1')  # no C++ INFO lines
  try:
    import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  except Exception as e:  # a broken install: one line, not a traceback
    raise UserError(
      f'TensorFlow Datasets does not import ({_first_line(e)}); reinstall '
      f'it with {TFDS_PIP}, or drop --source tfds to fetch {canonical}.'
    ) from None
  builder = name if folder == name else folder.replace(os.sep, '/')
  print(
    f'{task}: TFDS {builder} not prepared in {root} ({why}); TensorFlow '
    'Datasets downloads and prepares it there',
    flush=True,
  )
  try:
    tfds.builder(builder, data_dir=root).download_and_prepare()
  except Exception as e:  # network, disk, checksum: one line, not a trace
    raise UserError(
      f'TensorFlow Datasets could not download and prepare {builder} in '
      f'{root} ({_first_line(e)}); check the network and run the same '
      f'command again, or drop --source tfds to fetch {canonical}.'
    ) from None
  if not release.tfds_prepared(root, task):
    raise UserError(
      f'TensorFlow Datasets prepared {builder} but {root} holds no '
      f'{release.tfds_layout(task)} (another file format?); remove '
      f'{os.path.join(root, folder)} and run the same command again.'
    )
  return f'TFDS {name} downloaded and prepared in {root} ({why})'


# ------------------------------------------------------------------- entry


def download(
  task, data_dir, options, source='canonical', mirror=None, progress=True
):
  """Puts `task`'s release files where its reader looks; returns a line
  saying what was done."""
  if source == 'tfds':
    return tfds_download(task, data_dir)
  if source != 'canonical':
    raise UserError(f'Unknown --source {source!r}; use canonical or tfds.')
  key = TASK_SOURCES.get(task)
  if key is None:
    raise UserError(f'Unknown task {task!r}; known: {", ".join(TASK_SOURCES)}.')
  src = SOURCES[key]
  if key in ('imdb', 'cifar10'):
    dest = os.path.join(data_dir, task, src.name)
    return f'downloaded {fetch(src, dest, mirror, progress)}'
  archive = fetch(
    src, os.path.join(data_dir, 'downloads', src.name), mirror, progress
  )
  return f'downloaded {extract(archive, task, options, data_dir, progress)}'
