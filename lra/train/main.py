r"""Trains an LRA model: one jit-compiled step, data-parallel over all devices.
(train.py in a checkout; lra-train once installed).

  python train.py --config configs/listops.py:transformer,small --workdir runs/s
  python train.py --config configs/<task>.py:<model>[,small|,smoke] \
      --workdir DIR [--config.<key>=<value> ...]

`--print_config` prints the resolved config (every field as key = value under
its comment from configs/base.py and the task file) and exits; it needs no
--workdir.

The same command with the same workdir resumes from the latest checkpoint and
ends with the same results as an uninterrupted run. Writes config.json,
metrics.jsonl, checkpoints/{latest,best}/ and results.json: `test` measured on
the best-on-validation checkpoint, `test_last` on the final step's, `select`
the one the accuracy table reports (--config.select, lra/train/metrics.py; not
for an LM objective, whose best checkpoint has the lowest validation loss)
and `data_source` ('generated' or 'release'). steps/s (metrics.jsonl, progress
bar) counts training steps only: not compilation, evaluation or saving.

Bad input (config values, paths, data) stops with one `error:` sentence and
exit status 2 before the workdir is created. An unreadable checkpoint is
moved to checkpoints/unreadable/ with a warning and the run resumes from the
newest readable one. After a non-finite loss (or parameters), run the same
command with a lower --config.learning_rate or a --config.grad_clip_norm: it
resumes from the last good checkpoint and records the change (configs/base.py).

--config.init_from=DIR starts a fresh run from the encoder of DIR's best
(or --config.init_from_checkpoint=latest) checkpoint, heads and optimizer
fresh (lra/train/pretrained.py; recorded as a metrics.jsonl row of split
'config' at step 0). --config.length_schedule=1000:256,2000:1024 trains
the first steps on shorter crops (lra/train/curriculum.py; each train row of
metrics.jsonl then records its `length`).
"""

from lra.train.interrupt import on_ctrl_c_exit

# Ctrl-C while the program loads: one line, exit 130 (run as `python -m
# lra.train.main`; importing it sets nothing; train.py sets the same).
if __name__ == '__main__':
  on_ctrl_c_exit()

import os
import sys
from typing import Callable

from absl import flags
from ml_collections import ConfigDict

from lra.errors import UserError
from lra.train import cli, comments, loop
from lra.train import config as config_loader
from lra.train.checkpoints import Checkpoints
from lra.train.loop import train_and_evaluate  # noqa: F401 (train.py's)


def define_flags():
  config_loader.define_config_flag(
    'config',
    None,
    'configs/<task>.py:<model>[,<preset>]; set any field with '
    '--config.<key>=<value>. Every field is documented by the comment above '
    'it in configs/base.py and in the task file configs/<task>.py (a '
    "model.attention option in its core's module docstring); --print_config "
    'prints the resolved config with those comments.',
  )
  flags.DEFINE_string(
    'workdir',
    None,
    'Run directory: new, empty, or a run of this project (resumed).',
  )
  flags.DEFINE_bool(
    'allow_foreign_workdir',
    False,
    'Train in a --workdir that holds files other than a run of this '
    'project (without it such a folder is refused: a run there would '
    "overwrite a config.json or metrics.jsonl of someone else's). A run "
    'of this project is a folder with the config.json train.py writes, or '
    'its metrics.jsonl, or its checkpoints/.',
  )
  flags.DEFINE_bool(
    'print_config',
    False,
    'Print the resolved, locked config (every field as key = value under '
    'its comment from configs/base.py and the task file) and exit; needs no '
    '--workdir and creates nothing.',
  )
  cli.define_process_flags()
  flags.DEFINE_integer(
    'stop_after_steps',
    None,
    'Testing: exit abruptly (no save) after this '
    'step, as if the process were killed.',
  )


def kill_after(
  stop_after: int | None,
) -> Callable[[int, Checkpoints], None] | None:
  """The --stop_after_steps test hook: a callback that ends the process
  abruptly (status 3, no save) after that step, as a kill would then. Saves
  started at earlier steps are written first (a kill after them); one
  started at this very step is cut short (a kill while it is written)."""
  if stop_after is None:
    return None

  def on_step(step, ckpt):
    if step >= stop_after:
      if ckpt.pending and ckpt.pending[1] < step:
        ckpt.wait()
      sys.stdout.flush()
      os._exit(3)  # pylint: disable=protected-access

  return on_step


def print_config_text(config: ConfigDict) -> str:
  """--print_config's text: every field under its comment
  (lra/train/comments.py), headed by the --config argument."""
  spec = flags.FLAGS['config'].config_filename or ''
  task_file = config_loader.resolve(spec.split(':', 1)[0])
  arg = cli._config_arg(sys.argv)  # pylint: disable=protected-access
  return comments.config_text(config, task_file, arg)


def main(argv):
  config, workdir = flags.FLAGS.config, flags.FLAGS.workdir
  if stray := cli.stray_argument(argv):
    cli.exit_with_error(stray)
  if config is not None and flags.FLAGS.print_config:
    print(print_config_text(config), end='')
    return
  if config is None or not workdir:
    print(
      'error: give --config configs/<task>.py:<model> and --workdir DIR.',
      file=sys.stderr,
    )
    sys.exit(2)
  cli.quiet_logs()
  try:
    cli.initialize_processes()
    loop.train_and_evaluate(
      config,
      workdir,
      kill_after(flags.FLAGS.stop_after_steps),
      allow_foreign_workdir=flags.FLAGS.allow_foreign_workdir,
    )
  except UserError as e:
    cli.exit_with_error(e)


def run():
  """The command line: train.py, `python -m lra.train.main`, lra-train."""
  define_flags()
  cli.run_main(main, cli.parse_flags, usage=__doc__)


if __name__ == '__main__':
  run()
