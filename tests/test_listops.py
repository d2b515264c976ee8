"""ListOps: evaluator, generator, TSV format, reader errors and the CLI."""

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from lra import data as tasks
from lra.data import cache, listops, prepare
from lra.errors import UserError

ROOT = pathlib.Path(__file__).resolve().parents[1]
SMOKE = listops.VARIANTS['smoke']


def toks(text):
  """'[MAX 2 9 ]' -> token ids."""
  return [listops.TOKEN_ID[w] for w in text.split()]


@pytest.fixture(scope='module')
def smoke(tmp_path_factory):
  """The smoke splits of seed 0 and the folder of their TSV files."""
  out = tmp_path_factory.mktemp('smoke')
  splits, stats = listops.generate(SMOKE, 0, str(out))
  return splits, stats, out


def rows(inputs):
  return [r[r > 0].tolist() for r in inputs]


# ---------------------------------------------------------------- evaluator


@pytest.mark.parametrize(
  'text, value',
  [
    ('[MIN 3 1 2 ]', 1),
    ('[MAX 3 1 2 ]', 3),
    ('[SM 9 8 7 ]', 4),
    ('[SM 0 0 ]', 0),
    ('[MED 3 1 2 ]', 2),
    ('[MED 1 2 ]', 1),
    ('[MED 2 3 4 5 ]', 3),
    ('[MED 9 0 8 1 ]', 4),
    ('[MAX 2 9 [MIN 4 7 ] 0 ]', 9),
    ('[SM [MAX 9 9 ] [MED 8 9 ] 5 ]', 2),
    ('[MIN [MAX 1 [MED 7 [SM 5 6 ] 3 ] ] 8 ]', 3),
  ],
)
def test_evaluate(text, value):
  assert listops.evaluate(toks(text)) == value
  assert listops.evaluate(toks(text) + [0, 0]) == value  # padding


def test_median_is_numpy_median_truncated():
  rng = np.random.default_rng(0)
  for _ in range(200):
    args = rng.integers(0, 10, rng.integers(2, 11)).tolist()
    tree = [listops.MED] + [listops.DIGIT0 + a for a in args] + [listops.END]
    assert listops.evaluate(tree) == int(np.median(args))


@pytest.mark.parametrize('text', ['[MAX 2 9', '[MAX 2 9 ] ]', '2 3', '[SM ]'])
def test_evaluate_rejects_malformed(text):
  with pytest.raises(ValueError):
    listops.evaluate(toks(text))


# ---------------------------------------------------------------- generator


def test_generator_is_deterministic(smoke, tmp_path):
  splits, _, out = smoke
  again, _ = listops.generate(SMOKE, 0, str(tmp_path))
  for (x, y), (x2, y2) in zip(splits, again):
    np.testing.assert_array_equal(x, x2)
    np.testing.assert_array_equal(y, y2)
  for f in out.glob('*.tsv'):
    assert f.read_bytes() == (tmp_path / f.name).read_bytes()
  other, _ = listops.generate(SMOKE, 1)
  assert not np.array_equal(splits[0][0], other[0][0])


def test_worker_count_does_not_change_the_data():
  p = dict(SMOKE, chunk=256)  # several chunks
  one, _ = listops.generate(p, 3, workers=0)
  two, _ = listops.generate(p, 3, workers=2)
  for (x, y), (x2, y2) in zip(one, two):
    np.testing.assert_array_equal(x, x2)
    np.testing.assert_array_equal(y, y2)


def test_generated_trees_follow_the_rules(smoke):
  splits, stats, _ = smoke
  assert [len(y) for _, y in splits] == list(SMOKE['counts'])
  all_rows = []
  for x, y in splits:
    assert x.dtype == np.uint8 and x.shape[1] == SMOKE['max_length']
    assert y.dtype == np.int32
    n = (x > 0).sum(1)
    assert ((n > SMOKE['min_length']) & (n < SMOKE['max_length'])).all()
    # Tokens first, then only padding.
    assert (x[np.arange(x.shape[1]) >= n[:, None]] == 0).all()
    for r, label in zip(rows(x), y):
      assert listops.evaluate(r) == label
      depth = np.cumsum(np.isin(r, range(listops.MIN, listops.SM + 1)))
      depth -= np.cumsum(np.equal(r, listops.END))
      assert depth.max() < SMOKE['max_depth']  # digits at <= max_depth
    all_rows += map(tuple, rows(x))
  assert len(set(all_rows)) == len(all_rows)  # within and across splits
  assert stats['candidates'] > stats['accepted'] >= sum(SMOKE['counts'])
  labels = np.concatenate([y for _, y in splits])
  assert len(np.unique(labels)) == 10


def test_exhausting_a_tiny_space_dedupes():
  # Depth 2, two arguments: exactly 4 x 10 x 10 distinct trees exist.
  p = dict(max_depth=2, max_args=2, min_length=1, max_length=5)
  p.update(counts=(300, 50, 50), chunk=2048)
  splits, stats = listops.generate(p, 0)
  assert stats['duplicates'] > 0
  assert len({tuple(r) for x, _ in splits for r in rows(x)}) == 400
  with pytest.raises(ValueError, match='distinct'):
    listops.generate(dict(p, counts=(301, 50, 50), chunk=64), 0)


# ---------------------------------------------------------------- TSV format


def test_tsv_source_round_trip(smoke):
  splits, _, out = smoke
  assert listops.to_tsv_source(toks('[MAX 2 9 ]')) == '( ( ( [MAX 2 ) 9 ) ] )'
  nested = '[MAX 2 [MIN 4 7 ] ]'
  source = '( ( ( [MAX 2 ) ( ( ( [MIN 4 ) 7 ) ] ) ) ] )'
  assert listops.to_tsv_source(toks(nested)) == source
  assert listops.parse_source(source) == toks(nested)
  lines = (out / 'basic_val.tsv').read_text().splitlines()
  assert lines[0] == 'Source\tTarget'
  x, y = splits[1]
  for r, label, line in zip(rows(x), y, lines[1:], strict=True):
    source = listops.to_tsv_source(r)
    assert line == f'{source}\t{label}'  # the numpy writer = this one
    assert listops.parse_source(source) == r


def test_read_our_files(smoke):
  splits, _, out = smoke
  for split, (x, y) in zip(cache.SPLITS, splits):
    x2, y2 = listops.read_tsv(str(out / f'basic_{split}.tsv'), x.shape[1])
    np.testing.assert_array_equal(x, x2)
    np.testing.assert_array_equal(y, y2)


def test_read_the_official_format(tmp_path):
  path = tmp_path / 'basic_test.tsv'
  nested = '( ( ( [SM ( ( ( [MED 1 ) 2 ) ] ) ) 9 ) ] )'
  lines = ['Source\tTarget', '( ( ( [MAX 2 ) 9 ) ] )\t9', f'{nested}\t0']
  path.write_bytes(('\r\n'.join(lines) + '\r\n').encode())  # csv writer
  x, y = listops.read_tsv(str(path), 8)
  assert x.tolist() == [
    toks('[MAX 2 9 ]') + [0] * 4,
    toks('[SM [MED 1 2 ] 9 ]') + [0],
  ]
  assert y.tolist() == [9, 0]


GOOD = '( ( ( [MAX 2 ) 9 ) ] )'


@pytest.mark.parametrize(
  'lines, line_no, what',
  [
    (['Source\tTarget', f'{GOOD}\tx'], 2, 'label'),
    (['Source\tTarget', f'{GOOD}\t9', f'{GOOD}\t10'], 3, 'label'),
    (['Source\tTarget', f'{GOOD}\t'], 2, 'label'),
    (['Source\tTarget', f'{GOOD}\t-1'], 2, 'label'),
    (['Source\tTarget', '( ( ( [FIRST 2 ) 9 ) ] )\t2'], 2, "'[FIRST'"),
    (['Source\tTarget', '( ( ( [MAX 12 ) 9 ) ] )\t2'], 2, "'12'"),
    (['Source\tTarget', '( ( ( [MAX 2) 9 ) ] )\t2'], 2, "'2)'"),
    (['Source\tTarget', f'{GOOD}\t9\textra'], 2, '3 tab-separated'),
    (['Source\tTarget', f'{GOOD} 9'], 2, '1 tab-separated'),
    (['Source\tTarget', f'{GOOD}\t9', ''], 3, '1 tab-separated'),
    (['Source\tTarget', '\t9'], 2, 'no tokens'),
    (['Source\tTarget', '( ( ( [MAX 2 ) 9 )\t9'], 2, 'closing'),
    ([f'{GOOD}\t9'], 1, 'header'),
    (['Source,Target', f'{GOOD}\t9'], 1, 'header'),
    (
      ['Source\tTarget', '( ' * 9 + '[SM 1 ) 2 ) 3 ) 4 ) 5 ) 6 ) 7 ) ] )\t8'],
      2,
      '9',
    ),
  ],
)
def test_bad_files_name_file_and_line(tmp_path, lines, line_no, what):
  path = tmp_path / 'basic_train.tsv'
  path.write_text('\n'.join(lines) + '\n')
  with pytest.raises(UserError) as e:
    listops.read_tsv(str(path), 8)
  message = str(e.value)
  assert f'{path}, line {line_no}:' in message
  assert what in message
  assert '\n' not in message


def test_missing_file(tmp_path):
  with pytest.raises(UserError, match='basic_val.tsv not found'):
    listops.read_tsv(str(tmp_path / 'basic_val.tsv'), 8)


# ---------------------------------------------------------------- task API


def test_cache_name_and_options():
  assert listops.cache_name({}) == 'full'
  assert listops.cache_name({'variant': 'small'}) == 'small'
  assert listops.cache_name({'variant': 'smoke', 'seed': 2}) == 'smoke_seed2'
  with pytest.raises(UserError, match='known: full, small, smoke'):
    listops.cache_name({'variant': 'huge'})
  with pytest.raises(UserError, match="'varaint'"):
    listops.cache_name({'varaint': 'small'})


def test_prepare_converts_release_files(tmp_path):
  release = tmp_path / 'listops' / 'release'
  release.mkdir(parents=True)
  for split in cache.SPLITS:
    (release / f'basic_{split}.tsv').write_text(f'Source\tTarget\n{GOOD}\t9\n')
  task = tasks.get_task('listops')
  path = task.ensure_prepared(str(tmp_path), {}, progress=False)
  assert path == str(tmp_path / 'listops' / 'full')
  x, y = cache.load_split(path, 'test')
  assert x.shape == (1, 2000) and y.tolist() == [9]
  info = json.loads((tmp_path / 'listops' / 'full' / 'info.json').read_text())
  assert info['source'] == 'release' and info['counts']['train'] == 1
  # Release files are for 'full' only; smoke is generated.
  path = task.ensure_prepared(str(tmp_path), {'variant': 'smoke'}, False)
  assert len(cache.load_split(path, 'train')[1]) == SMOKE['counts'][0]
  # A partial release is an error, not a silent generation.
  (release / 'basic_val.tsv').unlink()
  with pytest.raises(UserError, match='basic_val.tsv is missing'):
    listops.prepare(str(tmp_path / 'x'), str(tmp_path), {}, False)


def test_parse_options():
  parser_args = type('Args', (), {})()
  parser_args.option = ['resolution=32', 'rate=0.5', 'name=hard', 'seed=3']
  parser_args.small, parser_args.variant, parser_args.seed = True, None, None
  options = prepare.parse_options(parser_args)
  assert options == {
    'resolution': 32,
    'rate': 0.5,
    'name': 'hard',
    'seed': 3,
    'variant': 'small',
  }
  parser_args.option = ['resolution']
  with pytest.raises(UserError, match='key=value'):
    prepare.parse_options(parser_args)


def run_cli(*args):
  env = dict(os.environ, PYTHONPATH=str(ROOT))
  return subprocess.run(
    [sys.executable, '-m', 'lra.data.prepare', *args],
    cwd=ROOT,
    env=env,
    capture_output=True,
    text=True,
    timeout=120,
  )


def test_cli_prepares_smoke(tmp_path):
  data = tmp_path / 'data'
  r = run_cli('listops', '--data_dir', str(data), '--variant', 'smoke')
  assert r.returncode == 0, r.stderr
  path = data / 'listops' / 'smoke'
  assert str(path) in r.stdout and 'train 256, val 64, test 64' in r.stdout
  assert cache.is_complete(str(path))
  assert (path / 'basic_train.tsv').exists()
  r = run_cli('listops', '--data_dir', str(data), '--variant', 'smoke')
  assert r.returncode == 0 and 'already prepared' in r.stdout


def test_cli_errors_are_one_line(tmp_path):
  r = run_cli('sudoku', '--data_dir', str(tmp_path))
  assert r.returncode == 2
  assert r.stderr.startswith('error: ') and r.stderr.count('\n') == 1
  assert 'listops' in r.stderr and 'pathfinder' in r.stderr
  r = run_cli('listops', '--data_dir', str(tmp_path), '--variant', 'huge')
  assert r.returncode == 2 and "'huge'" in r.stderr
  assert 'Traceback' not in r.stderr
