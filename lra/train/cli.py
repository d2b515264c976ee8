"""Flag parsing for the entry points: a bad flag is one sentence."""

import os
import re
import sys
import time
import warnings

from absl import flags, logging
from ml_collections import config_flags

from lra.data import TASKS
from lra.errors import UserError

# A --config.<key>=<value> override (or --noconfig.<key>).
OVERRIDE = re.compile(r'^--?(no)?config\.')
_ATTENTION_FLAG = re.compile(
  r'^--?config\.model\.attention\.([A-Za-z_][A-Za-z0-9_]*)(=(.*))?$', re.S
)


def _missing_key(e):
  """(key, suggestion or None) of a locked ConfigDict's missing-key error."""
  if (
    isinstance(e, AttributeError) and e.args and isinstance(e.args[0], KeyError)
  ):
    e = e.args[0]
  if not isinstance(e, KeyError) or not e.args:
    return None, None
  text = str(e.args[0])
  mean = re.search(r'Did you mean "([^"]+)" instead of "([^"]+)"', text)
  if mean:
    return mean.group(2), mean.group(1)
  return text.splitlines()[0].strip().strip(chr(39)), None


def attention_flags(argv):
  """{option: value} of the --config.model.attention.<option>=<value> flags
  in argv (the value None when it is the next argument)."""
  out = {}
  for arg in argv or ():
    m = _ATTENTION_FLAG.match(arg)
    if m:
      out[m.group(1)] = m.group(3)
  return out


def _model_of(argv):
  """The model of the --config=<file>:<model>[,<presets>] argument, or ''."""
  spec = _config_arg(argv or [])
  if ':' not in spec:
    return ''
  return spec.split(':', 1)[1].split(',')[0].strip() or 'transformer'


def _attention_sentence(e, argv):
  """The sentence for an unknown --config.model.attention.<option> (its
  core's options and defaults; lra/train/options.py), or None when e is
  about another key."""
  key, suggestion = _missing_key(e)
  given = attention_flags(argv)
  if key is None or key not in given:
    return None
  from lra.train import options  # pylint: disable=g-import-not-at-top

  return options.option_sentence(
    _model_of(argv), key, suggestion, given.get('name')
  )


def _sentence(e, argv=None):
  """The one sentence of a flag-parsing error; argv (when given) lets an
  unknown attention option name its core's options."""
  if argv:
    attention = _attention_sentence(e, argv)
    if attention:
      return attention
  if (
    isinstance(e, AttributeError) and e.args and isinstance(e.args[0], KeyError)
  ):
    e = e.args[0]  # ConfigDict wraps a missing key of a locked dict
  text = str(e.args[0] if isinstance(e, KeyError) and e.args else e)
  unknown = re.search(r"Unknown command line flag '([^']+)'", text)
  if unknown:
    name = unknown.group(1)
    if name.startswith('config.'):
      return (
        f'Unknown config key {name[len("config.") :]!r}; check its spelling '
        "against the task's config file (configs/<task>.py, configs/base.py)."
      )
    return f'Unknown flag --{name}; see --helpshort for the flags.'
  mean = re.search(r'Did you mean "([^"]+)" instead of "([^"]+)"', text)
  if mean:
    return (
      f'Unknown config key {mean.group(2)!r} (did you mean '
      f'{mean.group(1)!r}?); fix the --config.* flag.'
    )
  if isinstance(e, KeyError):
    return (
      f'Unknown config key {text.strip(chr(39))!r}; check its spelling '
      "against the task's config file (configs/<task>.py, configs/base.py)."
    )
  lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
  last = lines[-1] if lines else repr(e)
  if 'Error whilst parsing config file' in text or 'Traceback' in text:
    return re.sub(r'^\w+(Error|Exception): ', '', last)
  bad_value = re.match(r'flag (--\S+?)=(.*?): (.*)', text, re.S)
  if bad_value:
    flag, value, why = bad_value.groups()
    why = why.strip().splitlines()[0].rstrip('.')
    return f'{flag}={value} is not a valid value ({why}); fix it.'
  return last


def _config_arg(argv):
  """The value of --config in argv (or '')."""
  for i, arg in enumerate(argv):
    if arg.startswith(('--config=', '-config=')):
      return arg.split('=', 1)[1]
    if arg in ('--config', '-config') and i + 1 < len(argv):
      return argv[i + 1]
  return ''


def _no_config_sentence(path):
  path = path.split(':')[0]
  known = ', '.join(f'configs/{t}.py' for t in TASKS)
  return (
    f'cannot load config file {path!r}; give one of: {known} '
    '(as configs/<task>.py:<model>).'
  )


def _no_config_file(path):
  """Prints the missing config file's sentence and exits with 2."""
  print(f'error: {_no_config_sentence(path)}', file=sys.stderr)
  sys.exit(2)


def _check_config_loaded():
  """ml_collections reports a missing config file only when it is first
  used; surface it now."""
  if 'config' not in flags.FLAGS or not flags.FLAGS['config'].present:
    return
  try:
    flags.FLAGS.config.keys()
  except OSError:
    _no_config_file(flags.FLAGS['config'].config_filename)


# The flags that ask for the usage (absl's own --help prints the flags of
# the __main__ module only, none for a shim or console script, and exits
# with status 1).
HELP_FLAGS = ('--help', '-help', '-h', '--helpshort', '-helpshort', '-?')
# The modules whose flags --help lists: this project's, not its libraries'.
_OWN_MODULES = (
  'lra', 'experiments', '__main__', 'train', 'eval', 'benchmark', 'scaling',
)  # fmt: skip


def usage_text(flag_values=None):
  """--help's text: the program's usage (the __main__ module's docstring,
  which run_main sets to the program's own), then every flag this
  project defines, with its help and default."""
  values = flags.FLAGS if flag_values is None else flag_values
  main_module = sys.modules.get('__main__')
  doc = ((main_module and main_module.__doc__) or '').strip('\n')
  parts = [doc, '', 'flags:'] if doc else ['flags:']
  by_module = values.flags_by_module_dict()
  # The program's own flags first, the shared process flags (this module's)
  # last.
  for module in sorted(by_module, key=lambda m: (m == __name__, m)):
    defined = by_module[module]
    # absl names the __main__ module's flags by sys.argv[0].
    own = module == sys.argv[0] or module.split('.')[0] in _OWN_MODULES
    if not own or not defined:
      continue
    parts.append(values.module_help(module).rstrip())
  parts.append('')
  parts.append("--helpfull lists every flag, the libraries' included.")
  return '\n'.join(parts) + '\n'


def _help_asked(argv):
  """Whether argv asks for --help (before a bare '--')."""
  for arg in argv[1:]:
    if arg == '--':
      return False
    if arg in HELP_FLAGS:
      return True
  return False


def parse_flags(argv):
  """absl flags_parser: parses, or prints one sentence and exits with 2;
  --help (-h) prints the usage and this program's flags and exits 0."""
  if _help_asked(argv):
    sys.stdout.write(usage_text())
    sys.exit(0)
  try:
    args = flags.FLAGS(argv)
    _check_config_loaded()
    return args
  except OSError:  # a --config.<key> override loads a missing config file
    if not _config_arg(argv):
      raise
    _no_config_file(_config_arg(argv))
  except (flags.Error, KeyError, ValueError, AttributeError, TypeError) as e:
    print(f'error: {_sentence(e, argv)}', file=sys.stderr)
    sys.exit(2)
  except UserError as e:  # a config file that does not load (its line)
    print(f'error: {e}', file=sys.stderr)
    sys.exit(2)


_PARSE_ERRORS = (
  OSError,
  flags.Error,
  KeyError,
  ValueError,
  AttributeError,
  TypeError,
)


def config_from_argv(argv):
  """The locked config that train.py's flags give for argv (['train.py',
  '--config=configs/<task>.py:<model>', '--config.<key>=<value>', ...]),
  parsed in-process by the same absl + config_flags parser; UserError with
  train.py's one sentence when they are wrong. argv holds --config flags
  only."""
  from lra.train import config as config_loader  # pylint: disable=g-import-not-at-top

  values = flags.FlagValues()
  config_loader.define_config_flag(flag_values=values, sys_argv=argv)
  try:
    with warnings.catch_warnings():
      # ml_collections loads the config file with load_module(), which
      # warns (deprecated); the tests make warnings errors.
      warnings.filterwarnings(
        'ignore', 'the load_module', category=DeprecationWarning
      )
      values(argv)
      values.config.keys()  # a missing config file is read here
    return values.config
  except OSError:
    raise UserError(_no_config_sentence(_config_arg(argv))) from None
  except _PARSE_ERRORS as e:
    raise UserError(_sentence(e, argv)) from None


def split_overrides(argv):
  """(argv without the --config.* overrides, the overrides): for entry
  points whose config comes from elsewhere (eval.py: the run's
  config.json). An override's value may be the next argument."""
  rest, overrides = [], []
  i = 0
  while i < len(argv):
    arg = argv[i]
    i += 1
    if not OVERRIDE.match(arg):
      rest.append(arg)
      continue
    bare = '=' not in arg and not arg.lstrip('-').startswith('no')
    if bare and i < len(argv) and not argv[i].startswith('-'):
      arg = f'{arg}={argv[i]}'  # --config.<key> <value>
      i += 1
    overrides.append(arg)
  return rest, overrides


def override_config(config, overrides, only='model.attention.'):
  """`config` with the --config.<key>=<value> `overrides` applied by
  config_flags (types and errors as on train.py's command line); keys must
  start with `only`. UserError (one sentence) otherwise."""
  for arg in overrides:
    key = OVERRIDE.sub('', arg).split('=', 1)[0]
    if not key.startswith(only) or key == f'{only}name':
      raise UserError(
        f'{arg.split("=", 1)[0]} cannot be changed here; only '
        f'--config.{only}<option>=<value> flags (the options of the '
        "run's core, not its name) are accepted."
      )
  argv = ['eval.py', *overrides]
  values = flags.FlagValues()
  config.lock()
  try:  # the dict flag applies the overrides when it is defined
    config_flags.DEFINE_config_dict(
      'config', config, flag_values=values, lock_config=True, sys_argv=argv
    )
    values(argv)
  except _PARSE_ERRORS as e:
    key, suggestion = _missing_key(e)
    if key is not None and key in attention_flags(argv):
      from lra.train import options  # pylint: disable=g-import-not-at-top

      core = config.model.attention.name
      raise UserError(
        options.option_sentence(None, key, suggestion, None, core=core)
      ) from None
    raise UserError(_sentence(e)) from None
  return values.config


def define_process_flags():
  """The multi-process flags of train.py and eval.py
  (lra.train.processes.initialize): all three of --coordinator_address,
  --num_processes, --process_id (the same command on every process, each
  with its own id), or --distributed alone (JAX detects TPU pods and
  SLURM/Open MPI clusters)."""
  flags.DEFINE_bool(
    'distributed',
    False,
    'Multi-host (TPU pod slice, SLURM or Open MPI cluster): let JAX detect '
    'the processes; run the same command on every host.',
  )
  flags.DEFINE_string(
    'coordinator_address',
    None,
    'HOST:PORT of process 0 (with --num_processes and --process_id).',
  )
  flags.DEFINE_integer('num_processes', None, 'Processes in the run.')
  flags.DEFINE_integer('process_id', None, "This process's id, 0 .. N-1.")
  flags.DEFINE_integer(
    'distributed_timeout',
    300,
    'Seconds to wait for every process to join before stopping.',
  )


def initialize_processes():
  """lra.train.processes.initialize from the flags of define_process_flags."""
  from lra.train import processes  # pylint: disable=g-import-not-at-top

  f = flags.FLAGS
  return processes.initialize(
    f.coordinator_address,
    f.num_processes,
    f.process_id,
    distributed=f.distributed,
    timeout_s=f.distributed_timeout,
  )


def stray_argument(argv) -> UserError | None:
  """The one sentence for a word on the command line that is not a flag
  (absl leaves it in argv), or None."""
  if len(argv) > 1:
    return UserError(
      f'unexpected argument {argv[1]!r}; flags are written --name=value '
      '(see --help).'
    )
  return None


def exit_with_error(e):
  """Prints the one-sentence error and exits with status 2. In a
  multi-process run it leaves the message for the others (whose watchers,
  lra.train.processes, print it and exit with 2 too) and ends at once
  (os._exit), skipping JAX's shutdown barrier that would wait for them."""
  print(f'error: {e}', file=sys.stderr, flush=True)
  import jax  # pylint: disable=g-import-not-at-top

  if jax.distributed.is_initialized():
    from lra.train import processes  # pylint: disable=g-import-not-at-top

    processes.publish_error(str(e))
    sys.stdout.flush()
    if jax.process_index() == 0:
      time.sleep(1.0)  # it runs the coordination service: let them read
    os._exit(2)  # pylint: disable=protected-access
  sys.exit(2)


def quiet_logs():
  """Orbax logs every save at INFO; keep the terminal for the progress bar
  unless the user asked for a verbosity."""
  if not flags.FLAGS['verbosity'].present:
    logging.set_verbosity(logging.WARNING)


def run_main(main, flags_parser=None, usage=None):
  """absl's app.run(main), with Ctrl-C at any moment a clean stop: one
  line, exit status 130, no traceback (train.py's loop saves first: its
  own handler). usage: the text --help prints above the flags (absl reads
  the __main__ module's docstring: a shim's, a console script's or the
  program's own; the program's is given so that all print it)."""
  from absl import app  # pylint: disable=g-import-not-at-top

  main_module = sys.modules.get('__main__')
  if usage and main_module is not None:
    main_module.__doc__ = usage

  try:
    if flags_parser is None:
      app.run(main)
    else:
      app.run(main, flags_parser=flags_parser)
  except KeyboardInterrupt:
    print('Interrupted.', file=sys.stderr, flush=True)
    os._exit(130)  # pylint: disable=protected-access
