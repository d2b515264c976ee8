"""AAN document matching (LRA Retrieval): does one paper cite the other?

The LRA release's `new_aan_pairs.{train,eval,test}.tsv` (147,086 / 18,090 /
17,437 pairs): one pair per line, no header, five tab-separated fields:
label (0/1, also written 0.0/1.0), id1, id2, text1, text2. Each text becomes
its bytes + 1 (0 = padding, vocab 257), cut to 4,000 bytes: inputs are int16
[N, 2, 4000]. val is the eval file. Blank lines are skipped; any other row
that is not five fields with a 0/1 label is an error naming file:line.

Files are looked for in `<data_dir>/retrieval/`, then in
`<data_dir>/retrieval/tsv_data/` (the release's own folder name).
"""

import os

import numpy as np
import tqdm

from lra.data import cache
from lra.errors import UserError

WIDTH = 4000  # cache width in bytes, per document
FILES = {
  'train': 'new_aan_pairs.train.tsv',
  'val': 'new_aan_pairs.eval.tsv',
  'test': 'new_aan_pairs.test.tsv',
}
RELEASE = 'lra_release.gz'
URL = 'https://storage.googleapis.com/long-range-arena/lra_release.gz'
_LABELS = {b'0': 0, b'1': 1, b'0.0': 0, b'1.0': 1}


def cache_name(options):
  del options  # one format, one cache
  return 'aan'


def _find_dir(data_dir):
  root = os.path.join(data_dir, 'retrieval')
  for folder in (root, os.path.join(root, 'tsv_data')):
    present = [os.path.isfile(os.path.join(folder, f)) for f in FILES.values()]
    if all(present):
      return folder
    if any(present):
      missing = [f for f, p in zip(FILES.values(), present) if not p]
      raise UserError(
        f'Missing {os.path.join(folder, missing[0])}: take it from the '
        f'tsv_data/ folder of {RELEASE} ({URL}) and put it there.'
      )
  raise UserError(
    f'No AAN source found: download {RELEASE} ({URL}) and put its '
    'tsv_data/new_aan_pairs.{train,eval,test}.tsv files in '
    f'{root}/.'
  )


def _count_lines(path):
  count, last = 0, b'\n'
  try:
    with open(path, 'rb') as f:
      while chunk := f.read(1 << 24):
        count += chunk.count(b'\n')
        last = chunk[-1:]
  except OSError as e:
    raise UserError(f'Cannot read {path} ({e}).') from None
  return count + (last != b'\n')


def parse_line(line, where):
  """A TSV row -> (label, text1, text2); errors name `where` (file:line)."""
  fields = line.rstrip(b'\n').rstrip(b'\r').split(b'\t')
  if len(fields) != 5:
    raise UserError(
      f'{where}: expected 5 tab-separated fields (label, id1, id2, text1, '
      f'text2), found {len(fields)}; is the file complete?'
    )
  label = _LABELS.get(fields[0].strip())
  if label is None:
    raise UserError(
      f'{where}: label {fields[0][:20].decode("latin-1")!r} is not 0 or 1; '
      'is this an LRA new_aan_pairs file?'
    )
  return label, fields[3], fields[4]


def _fill(path, inputs, labels, progress):
  """Parses rows into the buffers; returns (rows, documents cut)."""
  n = cut = 0
  try:
    with open(path, 'rb') as f:
      lines = tqdm.tqdm(
        f,
        total=len(labels),
        desc=f'reading {os.path.basename(path)}',
        unit=' pairs',
        disable=not progress,
      )
      for line_no, line in enumerate(lines, 1):
        if not line.strip(b'\r\n'):
          continue
        labels[n], *texts = parse_line(line, f'{path}:{line_no}')
        for j, text in enumerate(texts):
          cut += len(text) > WIDTH
          row = np.frombuffer(text[:WIDTH], np.uint8)
          inputs[n, j, : len(row)] = row.astype(np.int16) + 1
        n += 1
  except OSError as e:
    raise UserError(f'Cannot read {path} ({e}).') from None
  if not n:
    raise UserError(f'{path} has no rows; fetch it again.')
  return n, cut


def _convert(path, cache_dir, split, progress):
  """Converts one TSV file into a cache split; returns (rows, docs cut).

  The buffer is allocated zeroed but untouched, so memory holds only the
  pages that text fills (at most 2.4 GB for the train split).
  """
  num_lines = _count_lines(path)
  if not num_lines:
    raise UserError(f'{path} is empty; fetch it again.')
  inputs = np.zeros((num_lines, 2, WIDTH), np.int16)
  labels = np.zeros(num_lines, np.int32)
  n, cut = _fill(path, inputs, labels, progress)
  cache.save_split(cache_dir, split, inputs[:n], labels[:n])
  return n, cut


def prepare(cache_dir, data_dir, options, progress=True):
  """Converts the three AAN TSV files into the cache."""
  del options
  folder = _find_dir(data_dir)
  os.makedirs(cache_dir, exist_ok=True)
  sizes, cut = {}, {}
  for split, name in FILES.items():
    sizes[split], cut[split] = _convert(
      os.path.join(folder, name), cache_dir, split, progress
    )
  cache.write_info(
    cache_dir,
    task='retrieval',
    source_path=folder,
    width=WIDTH,
    tokens='byte + 1; 0 = padding; [N, 2, width]',
    sizes=sizes,
    documents_cut=cut,
  )
