r"""ListOps (LRA): generator of nested list operations and reader of its TSVs.

An example is a tree such as [MAX 2 9 [MIN 4 7 ] 0 ] whose value (here 9) is
the label. The generator follows the reference
(lra_benchmarks/data/listops.py): operators MIN, MAX, MED (median truncated
to int, as `int(np.median(...))`), SM (sum mod 10); values 0..9; a node at
depth < max_depth is a leaf with probability 0.75 (always at max_depth), the
root is at depth 1, an operator takes randint(2, max_args) arguments; a tree
is kept when its token count (operators, digits and `]`) is strictly between
min_length and max_length, and no tree appears twice in the data set.

Unlike the reference it is seeded (same seed, byte-identical files) and fast:
candidates are grown breadth-first in numpy blocks, chunk by chunk (chunk i
draws from the seed sequence (seed, i)), in worker processes, and merged and
de-duplicated in chunk order, so the result does not depend on the worker
count. The reference drew the same distribution depth-first.

Files: `basic_{train,val,test}.tsv` with a `Source\tTarget` header and rows
`( ( ( [MAX 2 ) 9 ) ] )\t9` (the reference's parenthesised binary-tree
form; the reference's csv writer ended lines with \r\n, ours end with \n;
both are read). The official release files
(lra_release/listops-1000/basic_*.tsv) placed in `<data_dir>/listops/release/`
are converted instead of generating, for the 'full' variant with the default
seed 0. Tokens: parentheses dropped, `]` kept; the vocabulary is fixed (see
VOCAB), never built from the data.
"""

import concurrent.futures
import contextlib
import functools
import hashlib
import itertools
import logging
import multiprocessing
import os
import re
import time

import numpy as np
import tqdm

from lra.data import cache
from lra.errors import UserError

log = logging.getLogger(__name__)

# Token ids: 0 is padding, digits '0'..'9' are 1..10. Fixed, so caches and
# checkpoints are portable (the reference used Python's hash order).
VOCAB = ('<pad>', *'0123456789', '[MIN', '[MAX', '[MED', '[SM', ']')
TOKEN_ID = {t: i for i, t in enumerate(VOCAB) if i}
DIGIT0, MIN, MAX, MED, SM, END = 1, 11, 12, 13, 14, 15
VOCAB_SIZE = len(VOCAB)  # 16, as lra/data/__init__.py says

# The data variants. Changing any number changes the data of that variant.
#   max_depth, max_args: tree shape (root at depth 1, leaves at max_depth).
#   min_length, max_length: a tree is kept if min < tokens < max; the cache
#     is padded to width max_length.
#   counts: train/val/test examples.
#   chunk: candidate trees per chunk (the unit of seeding and of work).
VARIANTS = {
  # LRA ListOps, as released (listops-1000).
  'full': dict(
    max_depth=10,
    max_args=10,
    min_length=500,
    max_length=2000,
    counts=(96_000, 2_000, 2_000),
    chunk=16_384,
  ),
  # Shallower, shorter trees: learns visibly on a laptop CPU.
  'small': dict(
    max_depth=6,
    max_args=10,
    min_length=16,
    max_length=200,
    counts=(30_000, 1_000, 1_000),
    chunk=16_384,
  ),
  # A few hundred tiny trees, for tests.
  'smoke': dict(
    max_depth=4,
    max_args=10,
    min_length=4,
    max_length=64,
    counts=(256, 64, 64),
    chunk=4_096,
  ),
}
OPTIONS = ('variant', 'seed', 'workers')
RELEASE_DIR = os.path.join('listops', 'release')
HEADER = 'Source\tTarget'


# ---------------------------------------------------------------- semantics


def _apply(op, args):
  if op == MIN:
    return min(args)
  if op == MAX:
    return max(args)
  if op == SM:
    return sum(args) % 10
  s = sorted(args)  # MED; int(np.median(s)) of non-negative ints
  n = len(s)
  return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) // 2


def evaluate(tokens):
  """Value of a prefix tree given as token ids (trailing padding ignored)."""
  stack = [[None, []]]
  for t in tokens:
    t = int(t)
    if t == 0:
      break
    if DIGIT0 <= t < MIN:
      stack[-1][1].append(t - DIGIT0)
    elif MIN <= t <= SM:
      stack.append([t, []])
    elif t == END and len(stack) > 1 and stack[-1][1]:
      op, args = stack.pop()
      stack[-1][1].append(_apply(op, args))
    else:
      name = VOCAB[t] if t < len(VOCAB) else t
      raise ValueError(f'Malformed ListOps tokens at {name!r}.')
  if len(stack) != 1 or len(stack[0][1]) != 1:
    raise ValueError('Malformed ListOps tokens: unbalanced or not one tree.')
  return stack[0][1][0]


def to_tsv_source(tokens):
  """Token ids -> the reference's parenthesised source string."""
  out, opened = [], []  # opened: [index in out, arguments so far]
  for t in tokens:
    t = int(t)
    if t == 0:
      break
    if t == END:
      if not opened:
        raise ValueError('Malformed ListOps tokens: unmatched ].')
      i, n = opened.pop()
      out[i] = '( ' * (n + 1) + out[i]
      out.append('] )')
    elif MIN <= t <= SM:
      out.append(VOCAB[t])
      opened.append([len(out) - 1, 0])
      continue
    else:
      out.append(VOCAB[t])
    if opened:  # a digit or a closed subtree is an argument
      opened[-1][1] += 1
      out[-1] += ' )'
  return ' '.join(out)


# Source bytes -> token ids. Operators first become one letter each (letters
# that a checked source cannot contain), then every token is one byte.
_CHARS = b'()[] 0123456789MINAXEDS'
_OPS = ((b'[MIN', b'a'), (b'[MAX', b'b'), (b'[MED', b'c'), (b'[SM', b'd'))
_TO_ID = bytes.maketrans(b'0123456789abcd]', bytes(range(1, 16)))
_IDS = bytes(range(1, 16))
_JOINED = re.compile(rb'[^ ][^ ]')


def _tokenise(src):
  """Source bytes -> token id bytes; ValueError saying what is wrong."""
  s = None
  if not src.translate(None, _CHARS):
    s = src
    for op, letter in _OPS:
      s = s.replace(op, letter)
    # Fast path: single spaces put every token at an even offset.
    odd = s[1::2]
    spaced = odd.count(b' ') == len(odd) and b' ' not in s[::2]
    if spaced or not _JOINED.search(s):
      s = (s[::2] if spaced else s).translate(_TO_ID, b'() ')
    else:
      s = None
    if s is not None and s.translate(None, _IDS):
      s = None
  if s is None:
    bad = [w for w in src.split() if w not in _KNOWN_WORDS] or [src]
    raise ValueError(
      f'unknown token {bad[0].decode("utf-8", "replace")[:20]!r} (tokens are '
      'separated by spaces and are one of ( ) ] 0-9 [MIN [MAX [MED [SM)'
    )
  if not s:
    raise ValueError('the source has no tokens')
  ops = sum(s.count(i) for i in range(MIN, SM + 1))
  if ops != s.count(END):
    raise ValueError(f'{ops} operator(s) but {s.count(END)} closing ]')
  return s


_KNOWN_WORDS = {t.encode() for t in VOCAB[1:]} | {b'(', b')'}


def parse_source(source):
  """Reference source string -> list of token ids."""
  return list(_tokenise(source.encode()))


# ---------------------------------------------------------------- generator


def _grow(rng, p, num):
  """Grows `num` candidate trees breadth-first, one numpy pass per depth.

  One draw x per node holds independent uniform digits: x % 4 == 0 means an
  operator (p = 0.25, the reference's `random() <= 0.25`), then the number
  of arguments, the operator and the leaf value. A tree is abandoned once
  its tokens plus its pending nodes reach max_length.
  """
  a1 = p['max_args'] - 1
  tree = np.arange(num, dtype=np.int64)
  parent = np.zeros(0, np.int64)
  length = np.zeros(num, np.int64)
  dead = np.zeros(num, bool)
  levels = []
  for depth in range(1, p['max_depth'] + 1):
    if not len(tree):
      break
    x = rng.integers(0, 160 * a1, len(tree), dtype=np.int64)
    internal = x % 4 == 0
    if depth == p['max_depth']:
      internal[:] = False
    nargs = np.where(internal, 2 + x // 4 % a1, 0)
    length += np.bincount(tree, 1 + internal, num).astype(np.int64)
    pending = np.bincount(tree, nargs, num).astype(np.int64)
    dead |= length + pending >= p['max_length']
    levels.append((tree, parent, x, internal, nargs))
    grows = internal & ~dead[tree]
    parent = np.repeat(np.flatnonzero(grows), nargs[grows])
    tree = tree[parent]
  return levels, length, dead


def _combine(child, nargs, op):
  """Values of operators whose children values lie grouped in `child`."""
  starts = np.cumsum(nargs) - nargs
  grp = np.repeat(np.arange(len(nargs)), nargs)
  counts = np.bincount(grp * 10 + child, minlength=10 * len(nargs))
  below = counts.reshape(-1, 10).cumsum(1)
  lo = (below <= ((nargs - 1) // 2)[:, None]).sum(1)  # order statistics
  hi = (below <= (nargs // 2)[:, None]).sum(1)
  return np.choose(
    op,
    [
      np.minimum.reduceat(child, starts),
      np.maximum.reduceat(child, starts),
      (lo + hi) // 2,
      np.add.reduceat(child, starts) % 10,
    ],
  )


@functools.cache
def _pieces(max_args):
  """Byte pieces of the source, one per token plus one row end per label."""
  a1 = max_args - 1
  ops = VOCAB[MIN : SM + 1]
  texts = [f'{d} ) ' for d in range(10)]  # a digit argument
  texts += [
    '( ' * (n + 1) + f'{op} ' for op in ops for n in range(2, max_args + 1)
  ]
  texts += ['] ) ) ', '] )']  # closing an argument, closing the root
  texts += [f'\t{v}\n' for v in range(10)]
  width = max(len(t) for t in texts)
  table = np.zeros((len(texts), width), np.uint8)
  for i, t in enumerate(texts):
    table[i, : len(t)] = list(t.encode())
  lens = np.array([len(t) for t in texts], np.int64)
  first_op, first_end = 10, 10 + 4 * a1
  return table, lens, first_op, first_end, first_end + 2


def _assemble(levels, keep, p):
  """Prefix tokens, labels and source rows of the kept candidate trees."""
  a1 = p['max_args'] - 1
  lv, remap = [], None
  for d, (tree, parent, x, internal, nargs) in enumerate(levels):
    sel = keep[tree]
    if not sel.any():
      break
    lv.append(
      dict(
        parent=remap[parent[sel]] if d else None,
        op=x[sel] // (4 * a1) % 4,
        digit=x[sel] // (16 * a1),
        internal=internal[sel],
        nargs=nargs[sel][internal[sel]],
      )
    )
    remap = np.cumsum(sel) - 1
  # Bottom-up: subtree sizes in tokens and values.
  for d in reversed(range(len(lv))):
    v, n = lv[d], len(lv[d]['op'])
    v['size'] = 1 + v['internal'].astype(np.int64)
    v['value'] = v['digit'].copy()
    if d + 1 < len(lv):
      c = lv[d + 1]
      v['size'] += np.bincount(c['parent'], c['size'], n).astype(np.int64)
      i = v['internal']
      v['value'][i] = _combine(c['value'], v['nargs'], v['op'][i])
  # Top-down: position of every node in the output, one extra slot per row
  # for the row end of the source.
  sizes, labels = lv[0]['size'], lv[0]['value']
  offsets = np.cumsum(sizes + 1) - sizes - 1
  tokens = np.zeros(offsets[-1] + sizes[-1] + 1, np.uint8)
  piece = np.zeros(len(tokens), np.int64)
  table, lens, first_op, first_end, first_label = _pieces(p['max_args'])
  pos = offsets
  for d, v in enumerate(lv):
    i = v['internal']
    leaf, op_pos = pos[~i], pos[i]
    tokens[leaf] = DIGIT0 + v['digit'][~i]
    piece[leaf] = v['digit'][~i]
    tokens[op_pos] = MIN + v['op'][i]
    piece[op_pos] = first_op + v['op'][i] * a1 + v['nargs'] - 2
    end_pos = op_pos + v['size'][i] - 1
    tokens[end_pos] = END
    piece[end_pos] = first_end + (d == 0)
    if d + 1 < len(lv):
      cs = lv[d + 1]['size']
      before = np.cumsum(cs) - cs
      first = np.cumsum(v['nargs']) - v['nargs']
      pos = np.repeat(op_pos + 1 - before[first], v['nargs']) + before
  piece[offsets + sizes] = first_label + labels
  mask = np.arange(table.shape[1]) < lens[piece][:, None]
  source = table[piece][mask].tobytes()
  row_bytes = np.add.reduceat(lens[piece], offsets)
  return tokens[tokens > 0], sizes, labels.astype(np.uint8), source, row_bytes


def generate_chunk(p, seed, index):
  """Candidates of one chunk, seeded by (seed, index); a dict of arrays."""
  if p['min_length'] < 1:
    raise ValueError('min_length must be >= 1 (a root leaf is no list op).')
  rng = np.random.default_rng([seed, index])
  levels, length, dead = _grow(rng, p, p['chunk'])
  long = dead | (length >= p['max_length'])
  keep = ~long & (length > p['min_length'])
  out = dict(
    candidates=p['chunk'],
    accepted=int(keep.sum()),
    too_long=int(long.sum()),
    too_short=int((~long & ~keep).sum()),
  )
  if not keep.any():
    out.update(tokens=np.zeros(0, np.uint8), lengths=np.zeros(0, np.int64))
    out.update(labels=np.zeros(0, np.uint8), source=b'', digests=[])
    out.update(row_bytes=np.zeros(0, np.int64))
    return out
  tokens, lengths, labels, source, row_bytes = _assemble(levels, keep, p)
  ends = np.cumsum(lengths)
  flat = tokens.tobytes()
  out['digests'] = [
    hashlib.blake2b(flat[e - n : e], digest_size=16).digest()
    for e, n in zip(ends.tolist(), lengths.tolist())
  ]
  # Self-check of the vectorised code against the plain Python one.
  row = tokens[: lengths[0]]
  src = source[: row_bytes[0]].decode().split('\t')
  if evaluate(row) != labels[0] or parse_source(src[0]) != row.tolist():
    raise AssertionError(f'ListOps generator self-check failed: {src}')
  out.update(tokens=tokens, lengths=lengths, labels=labels)
  out.update(source=source, row_bytes=row_bytes)
  return out


def _chunks(p, seed, workers):
  """Yields generate_chunk(p, seed, i) for i = 0, 1, ... in order."""
  if workers <= 1:
    yield from map(
      functools.partial(generate_chunk, p, seed), itertools.count()
    )
    return
  # spawn, not fork: the caller may have started JAX's threads.
  ctx = multiprocessing.get_context('spawn')
  with concurrent.futures.ProcessPoolExecutor(workers, mp_context=ctx) as ex:
    pending, i = [], 0
    try:
      while True:
        while len(pending) <= workers:
          pending.append(ex.submit(generate_chunk, p, seed, i))
          i += 1
        yield pending.pop(0).result()
    finally:
      ex.shutdown(cancel_futures=True)


def generate(p, seed, out_dir=None, workers=0, progress=False):
  """Generates the splits of variant parameters p.

  Returns ([(inputs uint8 [N, max_length], labels int32 [N])] per split,
  statistics of the chunks used). With out_dir, also writes
  basic_{train,val,test}.tsv there. The data depend on p and seed only; with
  workers > 1 the chunks are made in spawned processes, so a calling script
  needs the `if __name__ == '__main__':` guard.
  """
  counts, total = p['counts'], sum(p['counts'])
  inputs = [np.zeros((n, p['max_length']), np.uint8) for n in counts]
  labels = [np.zeros(n, np.int32) for n in counts]
  stats = dict(candidates=0, accepted=0, too_short=0, too_long=0)
  stats['duplicates'] = 0
  paths = [os.path.join(out_dir or '', f'basic_{s}.tsv') for s in cache.SPLITS]
  seen, done, stale = set(), 0, 0
  with contextlib.ExitStack() as stack:
    files = [None] * len(paths)
    if out_dir:
      os.makedirs(out_dir, exist_ok=True)
      files = [stack.enter_context(open(f + '.tmp', 'wb')) for f in paths]
      for f in files:
        f.write(HEADER.encode() + b'\n')
    bar = stack.enter_context(
      tqdm.tqdm(total=total, unit='ex', desc='listops', disable=not progress)
    )
    chunks = stack.enter_context(contextlib.closing(_chunks(p, seed, workers)))
    for c in chunks:
      for k in stats:
        stats[k] += c.get(k, 0)
      rows = []
      for r, digest in enumerate(c['digests']):
        if done + len(rows) == total:
          break
        if digest in seen:
          stats['duplicates'] += 1
        else:
          seen.add(digest)
          rows.append(r)
      _store(c, rows, done, counts, inputs, labels, files)
      stale = 0 if rows else stale + 1
      if stale == 100:
        raise ValueError(f'Found only {done} distinct trees with {p}.')
      done += len(rows)
      bar.update(len(rows))
      if done == total:
        break
  if out_dir:
    for f in paths:
      os.replace(f + '.tmp', f)
  return list(zip(inputs, labels)), stats


def _store(c, rows, done, counts, inputs, labels, files):
  """Copies the chosen rows of chunk c, numbered from `done`, to splits."""
  if not rows:
    return
  rows = np.array(rows)
  lengths = c['lengths']
  padded = np.zeros((len(lengths), inputs[0].shape[1]), np.uint8)
  padded[np.arange(padded.shape[1]) < lengths[:, None]] = c['tokens']
  starts = (np.cumsum(c['row_bytes']) - c['row_bytes']).tolist()
  ends = np.cumsum(c['row_bytes']).tolist()
  src = memoryview(c['source'])
  bounds = np.cumsum(counts) - counts
  split = np.searchsorted(
    np.cumsum(counts), done + np.arange(len(rows)), 'right'
  )
  for s in np.unique(split):
    mine = rows[split == s]
    at = done + np.flatnonzero(split == s)[0] - bounds[s]
    inputs[s][at : at + len(mine)] = padded[mine]
    labels[s][at : at + len(mine)] = c['labels'][mine]
    if files[s]:
      files[s].write(b''.join(src[starts[r] : ends[r]] for r in mine))


# ---------------------------------------------------------------- reader


def read_tsv(path, width, progress=False):
  """Reads a ListOps TSV (ours or the release's) -> (inputs, labels)."""
  if not os.path.exists(path):
    raise UserError(
      f'ListOps file {path} not found; check the path (the release files '
      f'go in <data_dir>/{RELEASE_DIR}/).'
    )
  rows, labels = [], []
  name = os.path.basename(path)
  with open(path, 'rb') as f:
    header = f.readline().rstrip(b'\r\n')
    if header != HEADER.encode():
      _bad(path, 1, f'header is {header[:40]!r}, not {HEADER!r}')
    lines = tqdm.tqdm(f, unit='ex', desc=name, disable=not progress)
    for line_no, line in enumerate(lines, start=2):
      fields = line.rstrip(b'\r\n').split(b'\t')
      if len(fields) != 2:
        _bad(path, line_no, f'{len(fields)} tab-separated columns, not 2')
      src, label = fields
      if len(label) != 1 or not b'0' <= label <= b'9':
        _bad(path, line_no, f'label {label[:20]!r} is not an integer 0..9')
      try:
        tokens = _tokenise(src)
      except ValueError as e:
        _bad(path, line_no, str(e))
      if len(tokens) > width:
        _bad(path, line_no, f'{len(tokens)} tokens, over the {width} allowed')
      rows.append(tokens)
      labels.append(label[0] - 48)
  if not rows:
    raise UserError(
      f'{path} has no examples, only its header; fetch the file again '
      '(or remove the three release files to generate the data).'
    )
  lengths = np.array([len(r) for r in rows], np.int64)
  inputs = np.zeros((len(rows), width), np.uint8)
  inputs[np.arange(width) < lengths[:, None]] = np.frombuffer(
    b''.join(rows), np.uint8
  )
  return inputs, np.array(labels, np.int32)


def _bad(path, line_no, what):
  raise UserError(
    f'{path}, line {line_no}: {what}; fix that row or fetch the file again '
    '(format: header Source<TAB>Target, rows <source><TAB><label 0-9>).'
  )


# ---------------------------------------------------------------- task API


def _options(options):
  unknown = sorted(set(options) - set(OPTIONS))
  if unknown:
    raise UserError(
      f'Unknown ListOps option {unknown[0]!r}; known: {", ".join(OPTIONS)}.'
    )
  variant = options.get('variant', 'full')
  if variant not in VARIANTS:
    raise UserError(
      f'Unknown ListOps variant {variant!r}; known: {", ".join(VARIANTS)}.'
    )
  return variant, int(options.get('seed', 0))


def cache_name(options):
  """'full', 'small' or 'smoke'; a non-default seed is appended."""
  variant, seed = _options(options)
  return variant if seed == 0 else f'{variant}_seed{seed}'


def prepare(cache_dir, data_dir, options, progress):
  """Converts the release files ('full' only) or generates the data."""
  variant, seed = _options(options)
  p = VARIANTS[variant]
  release = os.path.join(data_dir, RELEASE_DIR)
  paths = [os.path.join(release, f'basic_{s}.tsv') for s in cache.SPLITS]
  found = [os.path.exists(f) for f in paths]
  start = time.time()
  info = dict(task='listops', variant=variant, vocab=list(VOCAB))
  info.update({k: v for k, v in p.items() if k != 'chunk'})
  if variant == 'full' and seed == 0 and any(found):
    if not all(found):
      missing = paths[found.index(False)]
      raise UserError(
        f'{missing} is missing; put all three release files basic_'
        '{train,val,test}.tsv in that folder, or none to generate.'
      )
    log.info('ListOps: converting the release files in %s.', release)
    splits = [read_tsv(f, p['max_length'], progress) for f in paths]
    info.update(source='release', release_dir=release)
  else:
    if any(found):
      log.info('ListOps: the release files are for full, seed 0; generating.')
    log.info(
      'ListOps %s: generating with seed %d in %s.', variant, seed, cache_dir
    )
    workers = options.get('workers', min(4, os.cpu_count() or 1))
    if sum(p['counts']) < 50_000:
      workers = 0  # starting processes would cost more than it saves
    splits, stats = generate(p, seed, cache_dir, workers, progress)
    info.update(source='generated', seed=seed, chunk=p['chunk'], stats=stats)
    info['acceptance'] = round(stats['accepted'] / stats['candidates'], 5)
  info['counts'] = {s: len(x[1]) for s, x in zip(cache.SPLITS, splits)}
  info['lengths'] = {
    s: _length_stats(x[0]) for s, x in zip(cache.SPLITS, splits)
  }
  info['seconds'] = round(time.time() - start, 1)
  os.makedirs(cache_dir, exist_ok=True)
  log.info('ListOps: %s in %.1f s.', info['counts'], info['seconds'])
  cache.write_info(cache_dir, **info)
  for s, (x, y) in zip(cache.SPLITS, splits):
    cache.save_split(cache_dir, s, x, y)


def _length_stats(inputs):
  n = (inputs > 0).sum(1)
  if not len(n):
    return {}
  return dict(
    min=int(n.min()), max=int(n.max()), mean=round(float(n.mean()), 1)
  )
