"""Plots a person can read (lra/report/plotstyle.py): labels that do not
overprint each other, smoothed training curves over their faint raw points,
and distinct styles past eight series."""

import json

import matplotlib

matplotlib.use('Agg')
from matplotlib import pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from lra.bench import report as bench_report  # noqa: E402
from lra.report import (
  curves,  # noqa: E402
  plotstyle,  # noqa: E402
)

PNG = b'\x89PNG\r\n\x1a\n'


def test_past_eight_series_each_has_its_own_style():
  few = plotstyle.series_styles([f'm{i}' for i in range(8)])
  assert len({s['color'] for s in few.values()}) == 8
  assert {s['linestyle'] for s in few.values()} == {'-'}
  names = [f'm{i}' for i in range(15)]
  many = plotstyle.series_styles(names)
  tab10 = set(plotstyle.palette())
  assert {s['color'] for s in many.values()} <= tab10
  looks = {(s['color'], s['linestyle'], s['marker']) for s in many.values()}
  assert len(looks) == 15
  # Where a colour comes back, the line style and marker differ.
  assert many['m0']['color'] == many['m10']['color']
  assert many['m0']['linestyle'] != many['m10']['linestyle']
  assert many['m0']['marker'] != many['m10']['marker']


def test_ema_smooths_without_bias():
  assert plotstyle.ema([3.0] * 10, 0.9) == pytest.approx([3.0] * 10)
  assert plotstyle.ema([5.0, 1.0], 0.5)[0] == pytest.approx(5.0)
  rng = np.random.default_rng(0)
  noisy = 1.0 + rng.normal(0, 0.2, 400)
  smooth = plotstyle.ema(noisy)
  assert np.std(smooth[50:]) < np.std(noisy) / 3
  assert np.mean(smooth[50:]) == pytest.approx(1.0, abs=0.05)
  assert plotstyle.auto_weight(10) == 0.0  # too few points: as logged
  assert 0.8 < plotstyle.auto_weight(100) < plotstyle.auto_weight(1000) <= 0.95


def _annotations(ax, names, xy):
  return [
    ax.annotate(
      name,
      xy,
      xytext=(0, 0),
      textcoords='offset points',
      ha='center',
      va='center',
      arrowprops=dict(arrowstyle='-'),
    )
    for name in names
  ]


def test_labels_at_one_point_are_moved_apart_inside_the_axes():
  fig, ax = plt.subplots(figsize=(5, 4))
  ax.set_xlim(0, 1)
  ax.set_ylim(0, 1)
  fig.tight_layout()
  texts = _annotations(ax, [f'label number {i}' for i in range(10)], (0.5, 0.5))
  assert plotstyle.overlapping_pairs(texts)  # all on one spot
  left = plotstyle.repel_labels(ax, texts, avoid=[(0.5, 0.5)])
  assert left == 0 and plotstyle.overlapping_pairs(texts) == []
  renderer = fig.canvas.get_renderer()
  frame = ax.get_window_extent(renderer)
  for text in texts:
    box = text.get_window_extent(renderer)
    assert frame.x0 - 1 <= box.x0 and box.x1 <= frame.x1 + 1
    assert text.arrow_patch.get_visible()  # moved: a leader to its point
  plt.close(fig)


def crowded_points():
  """Eleven LRA-like rows, most of them in one corner."""
  rows = [
    ('transformer', 54.4, 1.0, 5.2e9),
    ('transformer_fused', 54.4, 1.6, 4.1e9),
    ('local', 46.1, 11.6, 0.8e9),
    ('sparse_transformer', 51.2, 7.1, 1.4e9),
    ('longformer', 53.5, 5.7, 1.8e9),
    ('bigbird', 55.0, 5.6, 1.8e9),
    ('linformer', 51.4, 9.0, 1.1e9),
    ('performer', 51.4, 8.4, 1.0e9),
    ('reformer', 50.7, 9.0, 1.0e9),
    ('sinkhorn', 51.3, 9.9, 0.9e9),
    ('linear_transformer', 50.6, 11.5, 0.8e9),
  ]
  return [(m, a, s, b, ('listops', 'text')) for m, a, s, b in rows]


def test_bubble_chart_labels_do_not_overprint(tmp_path):
  fig = bench_report.bubble_figure(
    crowded_points(), 4096, True, 'accuracy (%)', '1 x cpu (test)'
  )
  ax = fig.axes[0]
  names = [t.get_text() for t in ax.texts]
  assert sorted(names) == sorted(p[0] for p in crowded_points())
  assert plotstyle.overlapping_pairs(ax.texts) == []
  path = tmp_path / 'bubble.png'
  fig.savefig(path, dpi=120)
  plt.close(fig)
  assert path.read_bytes()[:8] == PNG


def _runs(root, n, points=200, seed=0):
  rng = np.random.default_rng(seed)
  for k in range(n):
    d = root / f'run{k:02d}'
    d.mkdir(parents=True)
    rows = []
    for s in range(1, points + 1):
      loss = 2.0 * np.exp(-s / (50 + 10 * k)) + 0.3 + rng.normal(0, 0.1)
      rows.append({'step': s, 'split': 'train', 'loss': float(loss)})
      if s % 50 == 0:
        rows.append({'step': s, 'split': 'val', 'loss': float(loss)})
    (d / 'metrics.jsonl').write_text(
      ''.join(json.dumps(r) + '\n' for r in rows)
    )
  return str(root)


def test_training_curves_are_smoothed_over_faint_raw_points(tmp_path):
  root = _runs(tmp_path / 'runs', 2)
  data = curves.series(curves.find_runs([root]))
  fig = curves.figure(data, 'loss')
  train, val = fig.axes
  raw = [ln for ln in train.lines if ln.get_gid() == 'raw']
  smoothed = [ln for ln in train.lines if ln.get_gid() == 'smoothed']
  assert len(raw) == len(smoothed) == 2
  for line in raw:
    assert line.get_alpha() <= 0.3 and line.get_zorder() < 2
  weight = plotstyle.auto_weight(200)
  for line, (_, values) in zip(smoothed, data['loss', 'train'].values()):
    want = plotstyle.ema(values, weight)
    np.testing.assert_allclose(line.get_ydata(), want)
    assert np.std(np.diff(line.get_ydata())) < np.std(np.diff(values)) / 2
  assert 'EMA' in train.get_title()
  assert all(ln.get_gid() is None for ln in val.lines)  # as logged
  plt.close(fig)
  written, _ = curves.plot([root], str(tmp_path / 'png'))
  for path in written:
    with open(path, 'rb') as f:
      assert f.read(8) == PNG


def test_many_runs_get_distinct_styles_and_an_outside_legend(tmp_path):
  root = _runs(tmp_path / 'runs', 10, points=60)
  data = curves.series(curves.find_runs([root]))
  fig = curves.figure(data, 'loss')
  val = fig.axes[1]
  looks = {
    (ln.get_color(), ln.get_linestyle(), ln.get_marker()) for ln in val.lines
  }
  assert len(looks) == 10
  assert fig.legends and not val.get_legend()
  plt.close(fig)


def test_benchmark_plot_of_many_models_is_told_apart(tmp_path, monkeypatch):
  models = [
    'ceiling',
    'transformer',
    'transformer_fused',
    'transformer_xl',
    *(f'model{i}' for i in range(9)),
  ]
  rows = [
    dict(
      model=m,
      length=n,
      status='ok',
      steps_per_sec=(i + 1) / n,
      peak_memory_bytes=1e9,
      device_count=1,
      device_kind='cpu',
      backend='cpu',
      preset='paper',
      batch_size=1,
    )
    for i, m in enumerate(models)
    for n in (1024, 2048)
  ]
  figures = []
  monkeypatch.setattr(plt, 'close', figures.append)
  path = tmp_path / 'speed.png'
  bench_report.plot(rows, lambda r: r['steps_per_sec'], 'steps/s', str(path))
  monkeypatch.undo()
  (fig,) = figures
  lines = {ln.get_label(): ln for ln in fig.axes[0].lines}
  looks = {
    (str(ln.get_color()), ln.get_linestyle(), ln.get_marker())
    for ln in lines.values()
  }
  assert len(looks) == len(models)
  # The references: grey and black; transformer_xl is a model like others.
  assert lines['transformer'].get_color() == '0.1'
  assert lines['transformer_xl'].get_color() != '0.1'
  plt.close(fig)
  assert path.read_bytes()[:8] == PNG
