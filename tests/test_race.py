"""experiments/race/race.py: each pair computes the same thing on both sides
(outputs and gradients equal), checked at a small size. Needs the peers
(pip install torch local-attention linformer performer-pytorch); each pair
skipped without its peer."""

import pytest

pytest.importorskip('torch')

from experiments.race import race  # noqa: E402


@pytest.mark.parametrize('pair', race.PAIRS)
def test_pair_sides_agree(pair):
  if pair == 'local':
    pytest.importorskip('local_attention')
  if pair == 'linformer':
    pytest.importorskip('linformer')
  if pair == 'performer':
    pytest.importorskip('performer_pytorch')
  # 120 is not a multiple of Local's 50: the padded tail is compared too.
  p = race.Pair(pair, 1, 120, 2, 8)
  assert p.max_relative_difference < race.TOLERANCE
  p.ours()
  p.peer()


def test_unequal_sides_are_caught():
  p = race.Pair('transformer', 1, 64, 2, 8)
  same = p._peer_fn  # pylint: disable=protected-access
  p._peer_fn = lambda q, k, v: 1.01 * same(q, k, v)  # pylint: disable=protected-access
  with pytest.raises(AssertionError, match='differ'):
    p.check()


def test_gemm_rows_have_both_sides():
  from experiments.race import gemm  # pylint: disable=g-import-not-at-top

  rows = gemm.measure(rounds=1)
  assert [r['product'] for r in rows] == list(gemm.SHAPES)
  for r in rows:
    assert r['jax_ms'] > 0 and r['torch_ms'] > 0 and r['torch_over_jax'] > 0
