"""The model part of every task config: `apply_model(c, model_name)` sets
`c.model_name` and `c.model.attention` (every option of the model's core,
typed for the command line) as lra/train/options.py describes, with the
model's own paper recipe for the task when it has one (PAPER_RECIPES).

Model names, their cores and the option checks live in lra/train/options.py;
this file holds only what is configuration.
"""

from configs.s5_reference import S5_REFERENCE
from lra.train import options

# Model -> {task: flattened settings}: the hyperparameters its own paper
# trained it with on LRA, with their sources in the file named (applied
# after options.MODEL_SETTINGS, before the task's tuned overrides and the
# presets).
PAPER_RECIPES = {'s5': S5_REFERENCE}


def apply_model(c, model_name, overrides=None):
  """options.apply_model with the model's paper recipe for c.task; the
  task's tuned `overrides` ({model: {flattened key: value}}, the task
  file's MODEL_OVERRIDES) last. Raises ValueError for an unknown model."""
  recipe = PAPER_RECIPES.get(model_name, {}).get(c.task)
  options.apply_model(c, model_name, overrides, recipe)


def is_mixer_model(c):
  """Whether the config's model.attention is a sequence mixer."""
  return options.is_mixer_model(c)
