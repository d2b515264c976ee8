"""The self-pretraining presets (configs/base.py apply_spt): `small_spt` is
`small` with the masked_lm objective on every task config, and so on; the
two-command pipeline itself runs in tests/test_sweep.py
(test_small_spt_sweep_pretrains_then_fine_tunes, with smoke_spt)."""

import importlib
import json

import pytest

from configs import base

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
    "Unknown preset 'small_stp'; known presets: small, smoke, spt, "
    'small_spt, smoke_spt.'
  )
  assert base.parse_arg('local,small_spt,spt') == ('local', ['small', 'spt'])
