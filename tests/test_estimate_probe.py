"""A sweep's --dry_run estimate without an earlier run: a short probe of
each distinct config's compiled steps (lra/sweep/probe.py), at smoke
size."""

import functools
import re

import ml_collections
import pytest

from lra.sweep import estimate as sweep_estimate
from lra.sweep import main as sweep
from lra.sweep import plan as sweep_plan
from lra.sweep import probe as sweep_probe

plan = functools.partial(sweep_plan.plan, catalogue=sweep.catalogue())
# sweep_plan.run_config reads the config file with ml_collections, which
# loads it with load_module() (deprecated; the tests make warnings errors).
pytestmark = pytest.mark.filterwarnings(
  'ignore:the load_module:DeprecationWarning'
)


def config_of(run):
  config, problem = sweep_plan.run_config(run)
  assert problem is None, problem
  return config


def test_probe_times_the_compiled_steps_of_a_smoke_config(tmp_path):
  (run,) = plan('mqar', 'transformer', 'smoke', str(tmp_path))
  config = config_of(run)
  found = sweep_probe.probe(config, seconds=0.2)
  assert len(found.steps) >= 3 and min(found.steps) > 0
  assert len(found.eval_steps) >= 2 and found.compile_seconds > 0
  assert found.rate == pytest.approx(
    1 / sorted(found.steps)[len(found.steps) // 2], rel=0.5
  )
  # MQAR's config says its split sizes (none is prepared in tmp_path).
  size = config.eval_batch_size or config.batch_size
  assert found.eval_batches == {
    'val': -(-config.data.num_val // size),
    'test': -(-config.data.num_test // size),
  }
  est = sweep_probe.estimate(found, config, 0)
  assert est['low'] <= est['seconds'] <= est['high']
  assert est['evaluated'] and est['steps'] == config.num_train_steps
  assert est['overhead'] >= found.compile_seconds


def test_the_estimate_adds_compilation_and_evaluations():
  config = ml_collections.ConfigDict(
    {'num_train_steps': 100, 'eval_every_steps': 50}
  )
  found = sweep_probe.Probe(
    steps=[0.1, 0.2, 0.3],
    compile_seconds=5.0,
    eval_steps=[0.01, 0.02],
    eval_batches={'val': 2, 'test': 3},
  )
  # Validation at 50 and 100, the test on the best and last checkpoints.
  assert sweep_probe.evaluations(config, 0) == {'val': 2, 'test': 2}
  assert sweep_probe.evaluations(config, 60) == {'val': 1, 'test': 2}
  est = sweep_probe.estimate(found, config, 0)
  batches = 2 * 2 + 2 * 3
  assert est['seconds'] == pytest.approx(100 * 0.2 + 5 + batches * 0.015)
  assert est['low'] == pytest.approx(100 * 0.1 + 5 + batches * 0.01)
  assert est['high'] == pytest.approx(100 * 0.3 + 5 + batches * 0.02)
  assert est['rate'] == pytest.approx(5.0) and est['evaluated']
  unknown = sweep_probe.Probe([0.1], 1.0, [0.01], {})
  est = sweep_probe.estimate(unknown, config, 0)
  assert not est['evaluated'] and est['seconds'] == pytest.approx(11.0)
  assert sweep_probe.minutes(90) == '1.5' and sweep_probe.minutes(1500) == '25'


def test_one_probe_per_distinct_shape(tmp_path):
  grid = (('learning_rate', ('1e-3', '3e-3')), ('model.emb_dim', ('16', '32')))
  runs = plan('listops', 'transformer', 'smoke', str(tmp_path), grid=grid)
  keys = [sweep_probe.shape_key(config_of(r)) for r in runs]
  assert len(runs) == 4 and len(set(keys)) == 2  # the rate shares one


def test_dry_run_without_earlier_runs_is_probed(tmp_path, capsys, monkeypatch):
  calls = []
  real = sweep_probe.probe

  def counted(config, seconds=2.0):
    calls.append(config.model_name)
    return real(config, seconds)

  monkeypatch.setattr(sweep_probe, 'probe', counted)
  grid = (('learning_rate', ('1e-3', '3e-3')),)
  runs = plan(
    'mqar',
    'transformer,local',
    'smoke',
    str(tmp_path / 'sweep'),
    grid=grid,
  )
  sweep_estimate.dry_run(runs, None, probe=True, probe_seconds=0.1)
  out = capsys.readouterr().out
  assert calls == ['transformer', 'local']  # the learning rates share one
  assert 'timed by a short probe' in out.splitlines()[1]
  lines = [ln for ln in out.splitlines() if ln.startswith('[')]
  assert len(lines) == 4
  for line in lines:
    m = re.search(
      r'about \S+( \S+)? \(([\d.]+)-([\d.]+) min; 6 steps at [\d.]+ '
      r'steps/s, probed here, \+ \S+( \S+)? compilation and evaluation\)',
      line,
    )
    assert m, line
    assert float(m.group(2)) <= float(m.group(3))
  total = out.splitlines()[-1]
  assert re.fullmatch(
    r'Total: about \S+( \S+)? \([\d.]+-[\d.]+ min\) for 4 runs \(4 probed\)\.',
    total,
  ), total
  assert not (tmp_path / 'sweep').exists()  # writes nothing
  # --noprobe: unknown, as before.
  sweep_estimate.dry_run(runs[:1], None, probe=False)
  out = capsys.readouterr().out
  assert out.splitlines()[-1] == 'Total: about 0s for 0 runs (1 unknown).'
