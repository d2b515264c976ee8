"""The plan of a sweep (lra/sweep/main.py): which (task, model) runs, in which
workdirs, by which train.py commands, and each run's config as train.py
will parse it (without importing jax)."""

from __future__ import annotations

import dataclasses
import os
import re

from absl import flags

from lra import commands
from lra import data as tasks
from lra.errors import UserError
from lra.sweep import grid as sweep_grid
from lra.train import cli
from lra.train import config as config_loader
from lra.train.names import select_names

# The module a run's process runs (python -m; train.py's body).
TRAIN_MODULE = 'lra.train.main'
# A command-line argument that overrides a config field: train.py's.
OVERRIDE = re.compile(r'^--?(no)?config\.')


@dataclasses.dataclass(frozen=True)
class Run:
  """One (task, model) of a sweep: its workdir and train.py command.

  A fine-tune (`pretrained`: the self-pretraining preset, e.g. small_spt)
  is named <model>-<pretrained>-ft and starts from the encoder of the run
  <model>-<pretrained> (--config.init_from)."""

  task: str
  model: str
  preset: str
  out: str
  overrides: tuple = ()
  pretrained: str = ''
  # One combination of the sweep's --grid: ((key, value), ...), appended
  # to the command and naming a workdir below the (task, model)'s.
  grid: tuple = ()

  @property
  def name(self):
    if self.pretrained:
      return f'{self.task}/{self.model}-{self.pretrained}-ft'
    base = f'{self.task}/{self.model}' + (
      f'-{self.preset}' if self.preset else ''
    )
    return f'{base}/{sweep_grid.label(self.grid)}' if self.grid else base

  @property
  def pretraining(self):
    """The pretraining run a fine-tune starts from (None: not a fine-tune)."""
    if not self.pretrained:
      return None
    return Run(self.task, self.model, self.pretrained, self.out)

  @property
  def workdir(self):
    return os.path.join(self.out, self.name)

  @property
  def config_arg(self):
    """configs/<task>.py:<model>[,<preset>]: read from the working
    directory, else from the configs package (lra/train/config.py)."""
    model = f'{self.model},{self.preset}' if self.preset else self.model
    return f'configs/{self.task}.py:{model}'

  def argv(self):
    """train.py's arguments (after the program), as a user would type
    them; the run's process is `python -m lra.train.main` with them."""
    source = self.pretraining
    init = [f'--config.init_from={source.workdir}'] if source else []
    return [
      '--config',
      self.config_arg,
      '--workdir',
      self.workdir,
      *init,
      *self.overrides,
      *(f'--config.{k}={v}' for k, v in self.grid),
    ]

  def command(self):
    """The command a user would type here (lra/commands.py: `python
    train.py ...` in a checkout, `lra-train ...` elsewhere)."""
    return commands.command('train', *self.argv())


# Overrides that a self-pretraining preset's pretraining run alone takes
# (its fine-tune classifies); every other override goes to both.
PRETRAINING_KEYS = ('objective', 'mask_rate', 'model.tie_lm_head')


def _override_key(arg):
  return OVERRIDE.sub('', arg).split('=', 1)[0]


@dataclasses.dataclass(frozen=True)
class Catalogue:
  """What the configs offer, handed to `plan` by the command line
  (lra/sweep/main.py `catalogue`: the harness itself never imports configs/).

  presets, aliases: the preset names (configs/base.py PRESETS, ALIASES);
  fine_tune: self-pretraining preset -> its fine-tune's preset
  (FINE_TUNE_PRESET); models: every model name (lra/train/options.py).
  """

  presets: tuple
  aliases: tuple
  fine_tune: dict
  models: tuple


def plan(
  task_spec: str,
  model_spec: str,
  preset: str,
  out: str,
  overrides=(),
  *,
  catalogue: Catalogue,
  grid: tuple = (),
) -> list[Run]:
  """The runs of a sweep, task by task, in the order given; a
  self-pretraining preset (catalogue.fine_tune, e.g. small_spt) gives two
  runs per (task, model): the pretraining, then the fine-tune from its
  encoder. grid (lra/sweep/grid.py parse): each (task, model) runs once
  per combination."""
  preset = '' if preset in ('', 'none') else preset
  known = (*catalogue.presets, *catalogue.aliases)
  if preset and preset not in known:
    raise UserError(
      f'Unknown preset {preset!r} in --preset; valid: none, {", ".join(known)}.'
    )
  task_names = select_names(task_spec, tasks.TASKS, '--tasks', noun='task')
  model_names = select_names(
    model_spec, catalogue.models, '--models', noun='model'
  )
  overrides = tuple(overrides)
  if preset not in catalogue.fine_tune:
    return [
      Run(t, m, preset, out, overrides, grid=combination)
      for t in task_names
      for m in model_names
      for combination in sweep_grid.combinations(grid)
    ]
  if grid:
    raise UserError(
      f'--grid does not combine with the self-pretraining preset {preset}; '
      'grid the pretraining and the fine-tune as two sweeps.'
    )
  given = [a for a in overrides if _override_key(a).startswith('init_from')]
  if given:
    raise UserError(
      f"--preset {preset} sets each fine-tune's --config.init_from itself; "
      f'drop {given[0]} (or use --preset '
      f'{catalogue.fine_tune[preset] or "none"}).'
    )
  fine_tune = tuple(
    a for a in overrides if _override_key(a) not in PRETRAINING_KEYS
  )
  return [
    run
    for t in task_names
    for m in model_names
    for run in (
      Run(t, m, preset, out, overrides),
      Run(
        t,
        m,
        catalogue.fine_tune[preset],
        out,
        fine_tune,
        pretrained=preset,
      ),
    )
  ]


def run_config(run: Run) -> tuple:
  """(the run's config as train.py will parse it, None) or (None, the one
  sentence train.py would print). Imports no jax."""
  argv = [
    'train.py',
    f'--config={run.config_arg}',
    *run.overrides,
    *(f'--config.{k}={v}' for k, v in run.grid),
  ]
  values = flags.FlagValues()
  config_loader.define_config_flag(flag_values=values, sys_argv=argv)
  try:
    values(argv)
    return values.config, None
  except (
    OSError,
    flags.Error,
    KeyError,
    ValueError,
    AttributeError,
    TypeError,
  ) as e:
    return None, cli._sentence(e)  # pylint: disable=protected-access
