"""The one door to configs/: config files found, loaded and checked.

No other module of lra/ or models/ imports the configs package
(tests/test_layout.py); everything the library asks of it comes through
here: a task's config (`task_config('listops', 'transformer,small')`), the
base config, the preset names, the file of a task config, and the
`--config` flag of the programs (`define_config_flag`).

A `--config configs/<task>.py:<model>` path is read relative to the working
directory, as ml_collections' config_flags reads it; when no such file is
there and the path is the configs package's own spelling (`configs/<name>
.py`), the package's file is read instead. So the commands of the README
work from the repository and, once the project is installed
(`pip install .`), from any directory; a path to a config file of one's
own is read as given.

A config is checked once, where a run takes it (`check`: every field's
range, lra/train/validate.py, and the attention block,
lra/train/options.py), then trusted.
"""

import importlib
import os
import sys
import traceback

from absl import flags
import ml_collections
from ml_collections import config_flags
from ml_collections.config_flags import config_flags as config_file_flags

import configs
from lra.errors import UserError
from lra.train import applicable, options, validate


def configs_dir() -> str:
  """The folder of the configs package (the repository's configs/, or the
  installed one)."""
  return os.path.dirname(os.path.abspath(configs.__file__))


def resolve(path: str) -> str:
  """`path` when it exists; else, when it reads `configs/<name>.py` (the
  package's spelling), the package's file of that name when it exists;
  else `path` (its loader then says it cannot be read)."""
  if not path or os.path.exists(path):
    return path
  parts = os.path.normpath(path).split(os.sep)
  if len(parts) == 2 and parts[0] == 'configs':
    packaged = os.path.join(configs_dir(), parts[1])
    if os.path.isfile(packaged):
      return packaged
  return path


def resolve_spec(spec: str) -> str:
  """A `--config` value `<file>[:<arg>]` with its file resolved."""
  path, colon, arg = (spec or '').partition(':')
  return resolve(path) + colon + arg


def task_file(task: str) -> str:
  """The file of the task's config, `configs/<task>.py`, in the package."""
  return os.path.join(configs_dir(), f'{task}.py')


def _where(error: BaseException, path: str) -> tuple[str, int | None]:
  """(file, line) where loading the config file `path` failed: a syntax
  error's own place; else the innermost frame in a config file (`path`,
  or a file beside it or in the configs package that it imports)."""
  if isinstance(error, SyntaxError):
    return error.filename or path, error.lineno
  folders = {os.path.dirname(os.path.abspath(path)), configs_dir()}
  place = (path, None)
  for frame, line in traceback.walk_tb(error.__traceback__):
    name = os.path.abspath(frame.f_code.co_filename)
    if name == os.path.abspath(path) or os.path.dirname(name) in folders:
      place = (frame.f_code.co_filename, line)
  return place


def load_error(error: BaseException, spec: str) -> UserError:
  """The one sentence for a config file that raised `error` while it was
  loaded (a syntax error, a name it misspells, anything it raises):
  the file and line, the error, and what to do."""
  path = resolve_spec(spec).split(':', 1)[0]
  file, line = _where(error, path)
  at = f'{file}, line {line}' if line else file
  what = error.msg if isinstance(error, SyntaxError) else str(error)
  what = (what.strip().splitlines() or [''])[0]
  kind = type(error).__name__
  return UserError(
    f'cannot load config file {path}: {kind} at {at}'
    + (f' ({what})' if what else '')
    + '; fix the file or give another --config.'
  )


# The project's packages: an error raised in them about a config (an
# unknown model or preset) is a sentence already.
_PACKAGES = tuple(
  os.path.join(os.path.dirname(configs_dir()), p) + os.sep
  for p in ('configs', 'lra', 'models')
)


class _ConfigFileParser(config_file_flags.ConfigFileFlagParser):
  """config_flags' parser of a `<file>[:<arg>]` value, its file resolved
  (`resolve`). A file that fails to load (a syntax error, anything it
  raises) is one sentence naming the file and line; a missing file
  (OSError) and the configs package's own errors (an unknown model or
  preset) keep their sentences (lra/train/cli.py)."""

  def parse(self, path):
    # config_flags loads every file as the module '<flag>_config' with
    # load_module(), which executes a second file into the first one's
    # module when it is still in sys.modules: a file without get_config
    # would then run the earlier file's. Each parse starts afresh.
    sys.modules.pop(f'{self.name}_config', None)
    try:
      return super().parse(resolve_spec(path))
    except (OSError, UserError):
      raise
    except (ValueError, TypeError) as e:
      # config_flags re-raises these with the traceback in the text; the
      # configs package's own (an unknown model or preset) say what to
      # do, a file of one's own that raises one gets its line named.
      cause = e.__context__ or e
      frames = list(traceback.walk_tb(cause.__traceback__))
      inner = frames[-1][0].f_code.co_filename if frames else ''
      if os.path.abspath(inner).startswith(_PACKAGES):
        raise
      raise load_error(cause, path) from None
    except Exception as e:  # pylint: disable=broad-except
      raise load_error(e, path) from None


def define_config_flag(
  name: str = 'config',
  default: str | None = None,
  help_string: str = '',
  flag_values: flags.FlagValues = flags.FLAGS,
  sys_argv: list[str] | None = None,
):
  """config_flags.DEFINE_config_file (the config locked) whose file path is
  resolved as `resolve` says; returns its flag holder."""
  holder = config_flags.DEFINE_config_file(
    name,
    None if default is None else resolve_spec(default),
    help_string,
    flag_values=flag_values,
    lock_config=True,
    sys_argv=sys_argv,
  )
  flag_values[name].parser = _ConfigFileParser(name=name, lock_config=True)
  return holder


def _module(name: str):
  return importlib.import_module(f'configs.{name}')


def task_config(task: str, arg: str | None = None) -> ml_collections.ConfigDict:
  """`configs/<task>.py:<arg>` (arg: '<model>[,<preset>...]'), locked;
  ModuleNotFoundError for an unknown task, ValueError for an unknown model
  or preset."""
  module = _module(task)
  return module.get_config(arg) if arg is not None else module.get_config()


def base_config() -> ml_collections.ConfigDict:
  """configs/base.py's defaults, unlocked (no task, no model)."""
  return _module('base').get_base_config()


def presets() -> tuple[tuple, dict, dict]:
  """(every preset name, {alias: its presets}, {self-pretraining preset:
  its fine-tune's preset}) of configs/base.py."""
  base = _module('base')
  return tuple(base.PRESETS), dict(base.ALIASES), dict(base.FINE_TUNE_PRESET)


def check(config: ml_collections.ConfigDict) -> None:
  """UserError (one sentence) for anything wrong in a run's config: a field
  out of range (lra/train/validate.py) or an attention option its core
  does not take (lra/train/options.py)."""
  validate.check_config(config)
  options.check_attention(config)
  applicable.check(config, _reference(config))
  applicable.check_kernels(config)


def _reference(config) -> ml_collections.ConfigDict | None:
  """The task file's config of the run's model and presets (what the
  command gives without --config.* flags), or None when it does not build
  (a config file of one's own)."""
  spec = ','.join([config.model_name, *filter(None, [config.preset])])
  try:
    return task_config(config.task, spec)
  except Exception:  # pylint: disable=broad-except
    return None


def predated_defaults(config) -> ml_collections.ConfigDict:
  """configs/base.py's defaults with model.attention = every option of the
  config's core at its default: the values of the fields (and core
  options) that a saved run may predate (the `defaults` of
  lra/train/rundir.py check_resume), so a run saved before an option
  existed resumes while it keeps that option's default."""
  c = base_config()
  c.model.attention = options.attention_block(
    {'name': config.model.attention.name}
  )
  return c


def changed_from_command(config) -> dict:
  """{option: value} of model.attention that differ from the task config's
  own for this model and preset (the --config.model.attention flags);
  {} when that config no longer builds."""
  spec = ','.join([config.model_name, *filter(None, [config.preset])])
  try:
    reference = task_config(config.task, spec)
  except (ImportError, ValueError, UserError):
    return {}
  return options.changed_options(config, reference)
