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


def _look(style):
  return (style['color'], style['marker'], style['linestyle'])


def test_every_registered_model_has_its_own_fixed_style():
  """The map covers every model the registry makes; within a family no
  two models share a colour (transformer_fused is transformer's function:
  its colour, another line and marker); no two models share a look."""
  from lra.train import options  # pylint: disable=g-import-not-at-top
  from models.attention import registry  # pylint: disable=g-import-not-at-top

  models = set(registry.known_cores()) | set(options.MODELS)
  assert models <= set(plotstyle.MODEL_STYLES), models - set(
    plotstyle.MODEL_STYLES
  )
  aliases = {'softmax': 'transformer', 'none': 'ceiling'}
  own = {m: s for m, s in plotstyle.MODEL_STYLES.items() if m not in aliases}
  looks = [s[:3] for s in own.values()]
  assert len(set(looks)) == len(looks)
  for family in (plotstyle.ATTENTION, plotstyle.MIXERS):
    colours = [s[0] for m, s in own.items() if s[3] == family]
    shared = len(colours) - len(set(colours))
    assert shared == (1 if family == plotstyle.ATTENTION else 0), family
  for m, (_, _, _, fam) in own.items():
    if m in registry.known_cores():
      mixer = registry.is_mixer(registry.get_core_class(m))
      assert fam == (plotstyle.MIXERS if mixer else plotstyle.ATTENTION), m
  # Fixed: a model's style does not depend on the others in the figure.
  alone = plotstyle.series_styles(['gla'])['gla']
  crowd = plotstyle.series_styles([*sorted(models), 'gla (bi)', 'x'])
  assert alone == crowd['gla']
  assert crowd['gla']['color'] != crowd['mamba2']['color']  # docs/mqar.png


def test_variants_and_unknown_names_never_look_alike():
  names = [f'm{i}' for i in range(15)]
  many = plotstyle.series_styles(names)
  assert len({_look(s) for s in many.values()}) == 15
  names = ['transformer', 'transformer [small]', 'transformer [smoke]']
  variants = plotstyle.series_styles(names, models={'tf 1e-3': 'transformer'})
  assert len({_look(s) for s in variants.values()}) == 3
  assert {s['color'] for s in variants.values()} == {
    plotstyle.MODEL_STYLES['transformer'][0]
  }
  named = plotstyle.series_styles(
    ['tf 1e-3', 'transformer'], models={'tf 1e-3': 'transformer'}
  )
  assert (
    named['transformer']
    == plotstyle.series_styles(['transformer'])['transformer']
  )
  assert _look(named['tf 1e-3']) != _look(named['transformer'])


def test_more_than_ten_models_are_split_by_family():
  names = list(plotstyle.MODEL_STYLES)
  groups = plotstyle.panels(names, shared=('ceiling', 'transformer'))
  assert len(groups) > 2
  for title, group in groups:
    own = [n for n in group if n not in ('ceiling', 'transformer')]
    assert 0 < len(own) <= plotstyle.MAX_PER_PANEL, (title, group)
    assert {'ceiling', 'transformer'} <= set(group)
    assert len({plotstyle.family(n) for n in own}) == 1, title
  drawn = [n for _, g in groups for n in g]
  assert set(drawn) == set(names)
  assert plotstyle.panels(names[:10]) == [('', names[:10])]


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
  # Beside the row of panels: on its last panel, outside the axes.
  assert val.get_legend() and not fig.axes[0].get_legend()
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
  # 11 models besides the references: a panel per family, the references
  # in each; within a panel, no two lines look alike.
  assert len(fig.axes) == 2
  for ax in fig.axes:
    assert {'ceiling', 'transformer'} <= {ln.get_label() for ln in ax.lines}
    assert_panel_tells_apart(ax)
  lines = {ln.get_label(): ln for ax in fig.axes for ln in ax.lines}
  looks = {
    (str(ln.get_color()), ln.get_linestyle(), ln.get_marker())
    for ln in lines.values()
  }
  assert len(looks) == len(models)
  # Their fixed styles: transformer_fused and transformer_xl apart
  # (docs/benchmark_paper_b1_*.png drew them alike).
  for m in ('transformer', 'transformer_fused', 'transformer_xl'):
    want = plotstyle.MODEL_STYLES[m][:3]
    ln = lines[m]
    assert (ln.get_color(), ln.get_marker(), ln.get_linestyle()) == want
  plt.close(fig)
  assert path.read_bytes()[:8] == PNG


def assert_panel_tells_apart(ax):
  """No two labelled series of a panel share colour, marker and line
  style."""
  looks = [
    (matplotlib.colors.to_hex(ln.get_color()), ln.get_marker(),
     ln.get_linestyle())
    for ln in ax.lines
    if not ln.get_label().startswith('_')
  ]  # fmt: skip
  assert len(looks) == len(set(looks)), looks


def _looks_by_label(fig):
  """{label: (colour hex, marker, line style)} of a figure's labelled lines
  (the same label in two panels must look the same)."""
  out = {}
  for ax in fig.axes:
    for ln in ax.lines:
      label = ln.get_label()
      if label.startswith('_'):
        continue
      look = (
        matplotlib.colors.to_hex(ln.get_color()),
        ln.get_marker(),
        ln.get_linestyle(),
      )
      assert out.setdefault(label, look) == look, label
  return out


def test_a_model_looks_the_same_in_every_figure(tmp_path, monkeypatch):
  """Training curves of three runs and a benchmark plot of other models:
  the models they share are drawn alike; the MQAR width plot and the
  bubble chart take the same colours."""
  from experiments.mqar import report as mqar_report  # pylint: disable=g-import-not-at-top

  root = _runs(tmp_path / 'runs', 3, points=40)
  for k, model in enumerate(('gla', 'mamba2', 'transformer')):
    (tmp_path / 'runs' / f'run{k:02d}' / 'config.json').write_text(
      json.dumps({'model_name': model})
    )
  data = curves.series(curves.find_runs([root]))
  assert sorted(data['loss', 'train']) == ['gla', 'mamba2', 'transformer']
  curve_fig = curves.figure(data, 'loss')
  for ax in curve_fig.axes:
    assert_panel_tells_apart(ax)
  assert curve_fig.axes[0].get_ylabel() == 'loss (cross-entropy, nats)'
  in_curves = _looks_by_label(curve_fig)

  bench_models = ['ceiling', 'transformer', 'performer', 'mamba2', 'gla']
  rows = [
    dict(
      model=m, length=n, status='ok', steps_per_sec=(i + 1) / n,
      peak_memory_bytes=1e9, device_count=1, device_kind='cpu',
      backend='cpu', preset='paper', batch_size=1,
    )
    for i, m in enumerate(bench_models)
    for n in (1024, 2048)
  ]  # fmt: skip
  figures = []
  monkeypatch.setattr(plt, 'close', figures.append)
  bench_report.plot(
    rows, lambda r: r['steps_per_sec'], 'steps/s', str(tmp_path / 's.png')
  )
  mqar_rows = [
    {
      'model': m, 'name': None, 'core': m, 'form': 'causal',
      'seq_len': 64, 'pairs': 4, 'width': w, 'curve': {4: 0.5},
      'complete': True,
    }
    for m in ('mamba2', 'gla', 'based')
    for w in (32, 64)
  ]  # fmt: skip
  mqar_report.width_plot(mqar_rows, str(tmp_path / 'w.png'))
  monkeypatch.undo()
  bench_fig, width_fig = figures
  in_bench = _looks_by_label(bench_fig)
  in_width = _looks_by_label(width_fig)
  for ax in (*bench_fig.axes, *width_fig.axes):
    assert_panel_tells_apart(ax)
  for model in ('gla', 'mamba2', 'transformer'):
    assert in_curves[model] == in_bench[model], model
  for model in ('gla', 'mamba2'):
    assert in_width[model] == in_bench[model], model
  assert in_bench['gla'][0] != in_bench['mamba2'][0]
  for fig in (curve_fig, bench_fig, width_fig):
    plt.close(fig)
  # The bubble chart: each circle in its model's colour.
  points = [
    ('transformer [small]', 40.0, 1.0, 2e9, ('listops',)),
    ('gla [small]', 38.0, 2.0, 1e9, ('listops',)),
  ]
  fig = bench_report.bubble_figure(points, 1024, True, 'acc (%)', 'cpu')
  colours = {
    c.get_label(): matplotlib.colors.to_hex(c.get_color())
    for c in fig.axes[0].lines
  }
  assert colours['gla [small]'] == in_bench['gla'][0]
  assert colours['transformer [small]'] == in_bench['transformer'][0]
  plt.close(fig)


def test_curves_are_in_percent_with_labelled_axes(tmp_path):
  run = tmp_path / 'run'
  run.mkdir()
  rows = [
    {'step': s, 'split': sp, 'loss': 1.0, 'accuracy': 0.25}
    for s in (1, 2)
    for sp in ('train', 'val')
  ]
  (run / 'metrics.jsonl').write_text(
    ''.join(json.dumps(r) + '\n' for r in rows)
  )
  data = curves.series([str(run)])
  fig = curves.figure(data, 'accuracy')
  train, val = fig.axes
  assert val.get_ylabel() == 'accuracy (%)' and val.get_xlabel()
  assert list(val.lines[0].get_ydata()) == [25.0, 25.0]
  plt.close(fig)
