"""The self-pretraining presets (configs/base.py apply_spt): `small_spt` is
`small` with the masked_lm objective on every task config, and so on; the
two-command pipeline itself runs in tests/test_sweep.py
(test_small_spt_sweep_pretrains_then_fine_tunes, with smoke_spt). A
smoke_spt training (masks drawn in the jitted step, lra/train/objectives.py) is
deterministic and resumes exactly."""

import importlib
import json
import os

import pytest

from configs import base
from lra.train.metrics import read_rows
import train

TASKS = ('listops', 'text', 'retrieval', 'image', 'pathfinder', 'pathx')


def config_of(task, arg):
  module = importlib.import_module(f'configs.{task}')
  return json.loads(module.get_config(arg).to_json())


def differences(a, b):
  return {k: (a[k], b[k]) for k in a if a[k] != b[k]}


@pytest.mark.parametrize('task', TASKS)
def test_spt_presets_are_the_fine_tune_presets_plus_masked_lm(task):
  for spt, fine_tune in base.FINE_TUNE_PRESET.items():
    model = 'performer'  # a model's own settings survive the preset
    pretrain = config_of(task, f'{model},{spt}')
    plain = config_of(task, f'{model},{fine_tune}' if fine_tune else model)
    preset = ','.join([fine_tune, 'spt']).lstrip(',')
    assert differences(pretrain, plain) == {
      'preset': (preset, fine_tune),
      'objective': ('masked_lm', 'classify'),
    }, spt
    # The alias and its expansion build the same config.
    assert config_of(task, f'{model},{preset}') == pretrain


def test_unknown_preset_lists_the_aliases():
  with pytest.raises(ValueError) as e:
    config_of('listops', 'transformer,small_stp')
  assert str(e.value) == (
    "Unknown preset 'small_stp' for the listops task; its presets: small, "
    'smoke, spt, small_spt, smoke_spt.'
  )
  assert base.parse_arg('local,small_spt,spt') == ('local', ['small', 'spt'])


@pytest.mark.slow
def test_smoke_spt_training_is_deterministic_and_resumes_exactly(
  smoke_data_dir, tmp_path
):
  """Two runs of the same config end the same; so does one stopped after
  step 4 (its latest checkpoint: step 3) and run again."""
  config = importlib.import_module('configs.listops').get_config(
    'transformer,smoke_spt'
  )
  config.data_dir = smoke_data_dir
  assert config.objective == 'masked_lm'

  def stop_at_4(step, ckpt):
    del ckpt
    if step == 4:
      raise KeyboardInterrupt

  runs = {}
  for name in ('first', 'second', 'stopped'):
    workdir = str(tmp_path / name)
    if name == 'stopped':
      with pytest.raises(SystemExit) as e:
        train.train_and_evaluate(config, workdir, on_step=stop_at_4)
      assert e.value.code == 130
      assert not os.path.exists(os.path.join(workdir, 'results.json'))
    results = train.train_and_evaluate(config, workdir)
    rows = read_rows(os.path.join(workdir, 'metrics.jsonl'))
    runs[name] = (
      results,
      [
        {k: v for k, v in r.items() if k != 'steps_per_sec'}
        for r in rows
        if r['split'] != 'config'  # the resume's row
      ],
    )
  first = runs['first']
  assert first[0]['objective'] == 'masked_lm'
  assert first[0]['val']['count'] > 0
  assert any(r['split'] == 'train' for r in first[1])
  assert runs['second'] == first
  assert runs['stopped'] == first
