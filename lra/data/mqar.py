r"""MQAR: multi-query associative recall, generated (Zoology's multiquery_ar).

Arora, Eyuboglu et al. 2023, "Zoology: Measuring and Improving Recall in
Efficient Language Models", arXiv 2312.04927. An example of seq_len tokens
opens with num_kv_pairs key-value pairs, then asks every key again later;
the target at each query is the value the key was paired with:

  k1 v1 k2 v2 ... kn vn  x x k2 x x x x k1 x x ...    (inputs, x = noise)
                             v2          v1           (labels; -100 elsewhere)

Vocabulary of V = vocab_size ids: 0 is padding (never in the data), keys
are drawn from [1, V/2), values from [V/2, V), each without replacement
within an example (keys distinct, values distinct), as Zoology's. The n
pairs fill positions 0 .. 2n-1. The rest of the sequence holds (L - 2n) / 2
query slots (slot g at position 2n + 2g, its answer slot at 2n + 2g + 1);
pair i's query goes to slot g_i, the g_i drawn without replacement with

  P(g) = (g + 1)^(a - 1) / sum_h (h + 1)^(a - 1),  g = 0 .. (L - 2n)/2 - 1,

a = power_a (0.01: nearly 1/(g + 1); 1: uniform), drawn in pair order as
successive sampling (each next slot from the renormalised rest: the same
law as Zoology's np.random.choice(replace=False, p=P), here by the
Gumbel-top-k trick). Every other position holds a noise token uniform over
[1, V) (Zoology's random_non_queries=True; Zoology's noise also takes the
id 0, ours never does: 0 is the padding id).

Two forms (data.form):
  causal         Zoology's: next-token prediction under a causal mask. The
                 label of pair i sits at its query position (the model at
                 the query predicts the next token, the value); the answer
                 slot after it holds noise, as Zoology's.
  bidirectional  for encoders without a causal mask (Linformer, Sinkhorn,
                 ...): the answer slot after each query holds the mask id V
                 (the language model's extra embedding row, models/lm.py)
                 and the label sits at that slot.

Labels: int32 [N, L], the value at labelled positions and IGNORE = -100
(Zoology's, PyTorch's ignore index) elsewhere; lra/train/batching.py turns them
into targets and weights [B, L] (1 at labelled positions), so the loss and
the accuracy count the queries only (lra/train/objectives.py, objective
'per_position'). Inputs: int16 [N, L] (int32 when V + 1 > 32767).

Splits: train, val, test at (seq_len, num_kv_pairs), and the extra test
splits of data.test_splits ('256:16,512:32': seq_len:num_kv_pairs each,
cached as `test_256_16`, reported as '256:16'), with the same vocabulary,
power_a and form. Generation is seeded and chunked: chunk c of split s is
drawn from the seed sequence (seed, s, c) (an extra split: (seed, 3, L, n,
c), so it does not depend on the other splits listed, up to repeats
skipped); every example (its input tokens) is distinct within and across
all splits: a row already drawn is skipped, so val and the test splits
share no example with train (a shape with too few distinct examples is
one sentence). Time: O(N (V + L)) to draw; memory O(N L).
"""

import hashlib
import logging
import os
import time

import numpy as np

from lra.data import cache
from lra.errors import UserError

log = logging.getLogger(__name__)

IGNORE = -100  # the label of a position that is not a query (Zoology's)
FORMS = ('causal', 'bidirectional')
OPTIONS = (
  'vocab_size',
  'seq_len',
  'num_kv_pairs',
  'power_a',
  'form',
  'num_train',
  'num_val',
  'num_test',
  'test_splits',
  'seed',
)
# The reference sizes (Zoology: vocabulary 8,192, 100,000 training and
# 3,000 test examples per configuration; validation is ours).
DEFAULTS = dict(
  vocab_size=8192,
  seq_len=256,
  num_kv_pairs=16,
  power_a=0.01,
  form='causal',
  num_train=100_000,
  num_val=1_000,
  num_test=3_000,
  test_splits='',
  seed=0,
)
_TAG = 0x4D514152  # 'MQAR': keeps these draws apart from other streams
_EXTRA = 3  # the stream index of the extra test splits
_CELLS = 1 << 21  # random draws per chunk (keys / values: rows x V / 2)


# ---------------------------------------------------------------- options


def _int(options, name, lowest):
  value = options[name]
  if isinstance(value, bool) or not isinstance(value, int) or value < lowest:
    raise UserError(
      f'--config.data.{name}={value} is out of range: it must be an integer '
      f'>= {lowest}, e.g. --config.data.{name}={DEFAULTS[name]}.'
    )
  return value


def _check_shape(vocab_size, seq_len, num_kv_pairs, where):
  """One sentence when (seq_len, num_kv_pairs) does not fit."""
  if seq_len % 2 or seq_len < 4 * num_kv_pairs:
    raise UserError(
      f'{where}: seq_len {seq_len} with {num_kv_pairs} key-value pairs does '
      'not fit; seq_len must be even and at least 4 x num_kv_pairs (the '
      f'pairs, then a query slot and its answer per pair), e.g. '
      f'{max(4 * num_kv_pairs, seq_len + seq_len % 2)}.'
    )
  if vocab_size // 2 - 1 < num_kv_pairs:
    raise UserError(
      f'{where}: vocab_size {vocab_size} has {vocab_size // 2 - 1} key ids, '
      f'fewer than the {num_kv_pairs} distinct keys an example needs; use '
      f'--config.data.vocab_size={2 * num_kv_pairs + 2} or more.'
    )


def parse_test_splits(text):
  """'256:16,512:32' -> [(256, 16), (512, 32)]; '' -> []."""
  text = '' if text is None else str(text)
  out = []
  for item in (t.strip() for t in text.split(',')):
    if not item:
      continue
    parts = item.split(':')
    try:
      length, pairs = (int(p) for p in parts)
      ok = length >= 1 and pairs >= 1
    except ValueError:
      ok = False
    if not ok:
      raise UserError(
        f'--config.data.test_splits: {item!r} is not seq_len:num_kv_pairs '
        "(two positive integers); write e.g. test_splits='256:16,512:32'."
      )
    if (length, pairs) in out:
      raise UserError(
        f'--config.data.test_splits lists {item} twice; list each once.'
      )
    out.append((length, pairs))
  return out


def checked(options):
  """The options with the defaults filled, checked (one sentence each)."""
  unknown = sorted(set(options) - set(OPTIONS))
  if unknown:
    raise UserError(
      f'Unknown mqar option {unknown[0]!r}; known: {", ".join(OPTIONS)}.'
    )
  o = {**DEFAULTS, **options}
  _int(o, 'vocab_size', 4)
  _int(o, 'seq_len', 4)
  _int(o, 'num_kv_pairs', 1)
  for name in ('num_train', 'num_val', 'num_test'):
    _int(o, name, 1)
  _int(o, 'seed', 0)
  a = o['power_a']
  if isinstance(a, bool) or not isinstance(a, (int, float)) or not a > 0:
    raise UserError(
      f'--config.data.power_a={a} is out of range: it must be a number > 0 '
      "(0.01: Zoology's, near 1/gap; 1: uniform gaps), e.g. "
      '--config.data.power_a=0.01.'
    )
  o['power_a'] = float(a)
  if o['form'] not in FORMS:
    raise UserError(
      f'--config.data.form={o["form"]} is not one of {", ".join(FORMS)}; '
      'e.g. --config.data.form=causal.'
    )
  v = o['vocab_size']
  if v + 1 > np.iinfo(np.int32).max:
    raise UserError(
      f'--config.data.vocab_size={v} is too large; use at most 2^30.'
    )
  _check_shape(v, o['seq_len'], o['num_kv_pairs'], '--config.data')
  for length, pairs in parse_test_splits(o['test_splits']):
    _check_shape(
      v, length, pairs, f'--config.data.test_splits entry {length}:{pairs}'
    )
  return o


def extra_test_splits(options):
  """{'256:16': 'test_256_16', ...}: each extra test split's name in the
  results and its name in the cache."""
  o = checked(options)
  return {
    f'{length}:{pairs}': f'test_{length}_{pairs}'
    for length, pairs in parse_test_splits(o['test_splits'])
  }


def vocab_size(options):
  """The ids the model reads and predicts (0 = padding); the mask id of
  the bidirectional form is vocab_size itself (models/lm.py's extra row)."""
  return checked(options)['vocab_size']


def causal(options):
  """Whether the model runs under a causal mask (the causal form)."""
  return checked(options)['form'] == 'causal'


def cache_name(options):
  """E.g. 'causal_v8192_l256_kv16_a0.01_n100000-1000-3000_seed0', then
  '_t256x16-512x32' with extra test splits."""
  o = checked(options)
  name = (
    f'{o["form"]}_v{o["vocab_size"]}_l{o["seq_len"]}_kv{o["num_kv_pairs"]}'
    f'_a{o["power_a"]:g}_n{o["num_train"]}-{o["num_val"]}-{o["num_test"]}'
    f'_seed{o["seed"]}'
  )
  extra = parse_test_splits(o['test_splits'])
  if extra:
    name += '_t' + '-'.join(f'{length}x{pairs}' for length, pairs in extra)
  return name


# ---------------------------------------------------------------- generator


def _distinct(rng, rows, low, high, k):
  """int64 [rows, k]: per row, k distinct ids from [low, high), uniform and
  in uniformly random order (the k smallest of i.i.d. uniform scores, in
  the order of their scores)."""
  scores = rng.random((rows, high - low))
  pick = np.argpartition(scores, k - 1, axis=1)[:, :k]
  order = np.argsort(np.take_along_axis(scores, pick, 1), axis=1)
  return np.take_along_axis(pick, order, 1) + low


def gap_probabilities(space, power_a):
  """P(g), g = 0 .. space - 1: Zoology's power law in the query gap."""
  p = np.arange(1, space + 1, dtype=np.float64) ** (power_a - 1.0)
  return p / p.sum()


def _gaps(rng, rows, space, k, power_a):
  """int64 [rows, k]: k distinct slots per row by successive sampling from
  gap_probabilities (Gumbel-top-k: the k largest log P + Gumbel noise, in
  decreasing order, have exactly that law)."""
  log_p = np.log(gap_probabilities(space, power_a))
  scores = log_p - np.log(-np.log1p(-rng.random((rows, space))))
  pick = np.argpartition(-scores, k - 1, axis=1)[:, :k]
  order = np.argsort(-np.take_along_axis(scores, pick, 1), axis=1)
  return np.take_along_axis(pick, order, 1)


def draw(rng, rows, *, vocab_size, seq_len, num_kv_pairs, power_a, form):
  """rows examples: (inputs int64 [rows, L], labels int64 [rows, L],
  keys, values, gaps: int64 [rows, n], in pair order)."""
  v, length, n = vocab_size, seq_len, num_kv_pairs
  half = v // 2
  keys = _distinct(rng, rows, 1, half, n)
  values = _distinct(rng, rows, half, v, n)
  gaps = _gaps(rng, rows, (length - 2 * n) // 2, n, power_a)
  inputs = rng.integers(1, v, (rows, length))  # noise, never the padding id
  inputs[:, 0 : 2 * n : 2] = keys
  inputs[:, 1 : 2 * n : 2] = values
  query = 2 * n + 2 * gaps
  at = np.arange(rows)[:, None]
  inputs[at, query] = keys
  labels = np.full((rows, length), IGNORE, np.int64)
  if form == 'causal':
    labels[at, query] = values
  else:
    inputs[at, query + 1] = v  # the mask id
    labels[at, query + 1] = values
  return inputs, labels, keys, values, gaps


def _chunk_rows(o):
  """Examples per chunk: about _CELLS random draws, 16 .. 4096 rows."""
  width = max(o['vocab_size'] // 2, o['seq_len'])
  return int(np.clip(_CELLS // width, 16, 4096))


def generate_split(o, stream, count, seen, length=None, pairs=None):
  """(inputs, labels) of `count` examples at (length, pairs) (default: the
  training shape) from the seed sequence (seed, *stream, chunk); rows whose
  inputs are in `seen` (digests) are skipped, and the kept ones added."""
  length = o['seq_len'] if length is None else length
  pairs = o['num_kv_pairs'] if pairs is None else pairs
  dtype = (
    np.int16 if o['vocab_size'] + 1 <= np.iinfo(np.int16).max else (np.int32)
  )
  inputs = np.zeros((count, length), dtype)
  labels = np.zeros((count, length), np.int32)
  done, chunk, stale = 0, 0, 0
  rows = _chunk_rows(o)
  while done < count:
    rng = np.random.default_rng([o['seed'], *stream, chunk, _TAG])
    x, y, *_ = draw(
      rng,
      rows,
      vocab_size=o['vocab_size'],
      seq_len=length,
      num_kv_pairs=pairs,
      power_a=o['power_a'],
      form=o['form'],
    )
    x = x.astype(dtype)
    kept = []
    for r in range(rows):
      if done + len(kept) == count:
        break
      digest = hashlib.blake2b(x[r].tobytes(), digest_size=16).digest()
      if digest not in seen:
        seen.add(digest)
        kept.append(r)
    inputs[done : done + len(kept)] = x[kept]
    labels[done : done + len(kept)] = y[kept]
    done += len(kept)
    chunk += 1
    stale = 0 if kept else stale + 1
    if stale == 100:
      raise UserError(
        f'mqar: only {done} distinct examples of length {length} with '
        f'{pairs} pairs could be drawn after {chunk} chunks; use a larger '
        '--config.data.vocab_size or seq_len, or fewer examples.'
      )
  return inputs, labels


def generate(options):
  """{split: (inputs, labels)}: train, val, test and the extra test splits
  (by their cache names), every example distinct."""
  o = checked(options)
  seen = set()
  out = {}
  counts = (o['num_train'], o['num_val'], o['num_test'])
  for index, (split, count) in enumerate(zip(cache.SPLITS, counts)):
    out[split] = generate_split(o, (index,), count, seen)
  for length, pairs in parse_test_splits(o['test_splits']):
    out[f'test_{length}_{pairs}'] = generate_split(
      o, (_EXTRA, length, pairs), o['num_test'], seen, length, pairs
    )
  return out


# ---------------------------------------------------------------- task API


def prepare(cache_dir, data_dir, options, progress):
  """Generates every split into cache_dir (the extra test splits first, so
  a cache whose three main splits exist is complete)."""
  del data_dir, progress  # generated; seconds even at the reference size
  o = checked(options)
  start = time.time()
  log.info('mqar: generating %s in %s.', cache_name(o), cache_dir)
  splits = generate(o)
  info = dict(task='mqar', source='generated', options=o)
  info.update(
    pad_id=0,
    key_ids=[1, o['vocab_size'] // 2],
    value_ids=[o['vocab_size'] // 2, o['vocab_size']],
    mask_id=o['vocab_size'],
    ignore_label=IGNORE,
    counts={s: len(x) for s, (x, _) in splits.items()},
    seconds=round(time.time() - start, 1),
  )
  os.makedirs(cache_dir, exist_ok=True)
  cache.write_info(cache_dir, **info)
  names = [s for s in splits if s not in cache.SPLITS] + list(cache.SPLITS)
  for s in names:
    cache.save_split(cache_dir, s, *splits[s])
  log.info('mqar: %s in %.1f s.', info['counts'], info['seconds'])
