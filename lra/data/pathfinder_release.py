"""The LRA release's Pathfinder files: where they are, and how to read them.

lra_release.gz holds lra_release/pathfinder{32,64,128,256}/<folder>/
{imgs/<k>/sample_<i>.png, metadata/<k>.npy}, one folder per difficulty
(RELEASE_FOLDERS). Each metadata/<k>.npy is a TEXT file despite its name,
one image per line: `imgs/<k> sample_<i>.png <index> <label> ...` (a real
.npy of strings is read too). lra/data/pathfinder.py converts a folder into
the task's cache; `--stats` reads a sample of it beside generated images.
"""

import os

import numpy as np

from lra.errors import UserError

# The release's folder per difficulty (lra_benchmarks/data/pathfinder.py):
# the 6-paddle set is the generator's baseline condition.
RELEASE_FOLDERS = {
  'easy': 'curv_baseline',
  'intermediate': 'curv_contour_length_9',
  'hard': 'curv_contour_length_14',
}


def release_dir(data_dir, resolution, difficulty):
  """The release folder of these options, or None when it is absent."""
  tasks = (
    ('pathx', 'pathfinder') if resolution >= 128 else ('pathfinder', 'pathx')
  )
  sub = os.path.join(f'pathfinder{resolution}', RELEASE_FOLDERS[difficulty])
  for t in tasks:
    path = os.path.join(data_dir, t, 'release', sub)
    if os.path.isdir(os.path.join(path, 'metadata')):
      return path
  return None


def _metadata_rows(path):
  """Yields (line number, fields) of one metadata file."""
  with open(path, 'rb') as f:
    magic = f.read(6)
  if magic == b'\x93NUMPY':  # a real .npy of strings, as np.save made it
    rows = np.load(path, allow_pickle=False)
    for i, row in enumerate(np.atleast_2d(rows), 1):
      yield i, [str(x) for x in row]
    return
  with open(path, encoding='utf-8', errors='replace') as f:
    for i, line in enumerate(f, 1):
      if line.strip():
        yield i, line.split()


def read_release_index(root):
  """[(image path, label, metadata file, line)] of a release folder."""
  meta = os.path.join(root, 'metadata')
  names = [n for n in os.listdir(meta) if n.endswith('.npy')]
  names.sort(key=lambda n: (0, int(n[:-4])) if n[:-4].isdigit() else (1, n))
  entries = []
  for name in names:
    path = os.path.join(meta, name)
    for line_no, fields in _metadata_rows(path):
      if len(fields) < 4:
        raise UserError(
          f'{path}, line {line_no}: expected "imgs/<k> sample_<i>.png '
          '<index> <label> ...", got too few fields; fix or delete that line.'
        )
      if fields[3] not in ('0', '1'):
        raise UserError(
          f'{path}, line {line_no}: label {fields[3]!r} is not 0 or 1; fix '
          'or delete that line.'
        )
      entries.append(
        (
          os.path.join(root, fields[0], fields[1]),
          int(fields[3]),
          path,
          line_no,
        )
      )
  if not entries:
    raise UserError(
      f'{meta} lists no images; extract the release archive again.'
    )
  return entries


def read_png(path, resolution, meta, line_no):
  """Pixels uint8 [resolution**2], or None when the file is unreadable."""
  from PIL import Image  # only the release path needs PIL

  try:
    with Image.open(path) as im:
      im.load()
      size = im.size
      pixels = np.asarray(im.convert('L'), np.uint8)
  except (OSError, ValueError, SyntaxError):
    return None
  if size != (resolution, resolution):
    raise UserError(
      f'{meta}, line {line_no}: {path} is {size[0]} x {size[1]}, not '
      f'{resolution} x {resolution}; put pathfinder{resolution} files in '
      f'the pathfinder{resolution} folder.'
    )
  return pixels.reshape(-1)
