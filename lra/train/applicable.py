"""Config fields that apply to some models or settings only: one set
where it does nothing is refused in one sentence (a run that trains
without a word would let the user believe it was used).

  ssm_learning_rate, ssm_weight_decay   a core with state-space parameters
                                        (a mixer's `ssm_params`: S4D, S5,
                                        H3, Mamba, Mamba-2); ssm_weight_decay
                                        with ssm_learning_rate > 0 only
  model.norm, model.prenorm             model.block=ssm
  model.segment_length, segment_remat   a recurrent core (transformer_xl,
                                        compressive_transformer)
  mask_rate                             objective masked_lm
  model.tie_lm_head                     an LM objective (causal_lm,
                                        masked_lm, per_position)
  init_from_checkpoint                  init_from

A field counts as set when it differs from what the task file gives the
same model and presets (`reference`): the configs' own values for every
model are not the user's doing.
"""

import sys

from lra.errors import UserError
from models.attention import registry


def _core(config):
  return registry.get_core_class(config.model.attention.name)


def _has_ssm_params(config):
  """Whether the core or a module of its file lists `ssm_params` (Mamba's
  are on its per-direction submodule), as lra/train/steps.py
  ssm_parameter_paths finds them in the built model."""
  core = _core(config)
  module = sys.modules.get(core.__module__)
  classes = [core, *vars(module).values()] if module else [core]
  return any(
    isinstance(c, type) and c.__module__ == core.__module__
    and getattr(c, 'ssm_params', ())
    for c in classes
  )  # fmt: skip


# field -> (applies(config), where it applies: the sentence's end).
RULES = {
  'ssm_learning_rate': (
    _has_ssm_params,
    'a core with state-space parameters (s4d, s5, h3, mamba, mamba2: '
    'their ssm_params)',
  ),
  'ssm_weight_decay': (
    lambda c: _has_ssm_params(c) and c.ssm_learning_rate > 0,
    'a core with state-space parameters and --config.ssm_learning_rate > 0 '
    '(else every parameter takes --config.weight_decay)',
  ),
  'model.norm': (
    lambda c: c.model.block == 'ssm',
    '--config.model.block=ssm (the transformer block is pre-LN)',
  ),
  'model.prenorm': (
    lambda c: c.model.block == 'ssm',
    '--config.model.block=ssm (the transformer block is pre-LN)',
  ),
  'model.segment_length': (
    lambda c: bool(getattr(_core(c), 'recurrent', False)),
    'the segment-recurrent models (transformer_xl, compressive_transformer)',
  ),
  'model.segment_remat': (
    lambda c: bool(getattr(_core(c), 'recurrent', False)),
    'the segment-recurrent models (transformer_xl, compressive_transformer)',
  ),
  'mask_rate': (
    lambda c: c.get('objective', 'classify') == 'masked_lm',
    '--config.objective=masked_lm',
  ),
  'model.tie_lm_head': (
    lambda c: c.get('objective', 'classify') != 'classify',
    'an LM objective (--config.objective=causal_lm or masked_lm)',
  ),
  'init_from_checkpoint': (
    lambda c: bool(c.init_from),
    '--config.init_from=DIR (a run to start from)',
  ),
}


def _value(config, dotted):
  for part in dotted.split('.'):
    if part not in config:
      return None
    config = config[part]
  return config


def check(config, reference) -> None:
  """UserError naming the first field of RULES set (different from
  `reference`, the task file's config of this model and presets) where it
  does not apply; reference None (a config file of one's own whose task
  config does not build): nothing is compared."""
  if reference is None:
    return
  model = config.get('model_name') or config.model.attention.name
  for key, (applies, where) in RULES.items():
    value, default = _value(config, key), _value(reference, key)
    if value == default or applies(config):
      continue
    raise UserError(
      f'--config.{key}={value} does not apply to this run ({model}, '
      f'{config.task}): it is read only with {where}; drop the flag.'
    )


def check_kernels(config) -> None:
  """A compiled kernel the config demands (Mamba's scan_kernel=native)
  that cannot run here is one sentence now, before the workdir exists,
  not at the first step's compilation (models/mixers/mamba.py scan_for;
  'auto' falls back to the XLA scan by itself)."""
  if config.model.attention.get('scan_kernel') == 'native':
    from models.mixers import mamba  # pylint: disable=g-import-not-at-top

    mamba.scan_for('native')
