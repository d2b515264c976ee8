"""Flag parsing for the entry points: a bad flag is one sentence."""

import os
import re
import sys
import time

from absl import flags

from lra.tasks import TASKS


def _sentence(e):
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


def _no_config_file(path):
  """Prints the missing config file's sentence and exits with 2."""
  path = path.split(':')[0]
  known = ', '.join(f'configs/{t}.py' for t in TASKS)
  print(
    f'error: cannot load config file {path!r}; give one of: {known} '
    '(as configs/<task>.py:<model>).',
    file=sys.stderr,
  )
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


def parse_flags(argv):
  """absl flags_parser: parses, or prints one sentence and exits with 2."""
  try:
    args = flags.FLAGS(argv)
    _check_config_loaded()
    return args
  except OSError:  # a --config.<key> override loads a missing config file
    if not _config_arg(argv):
      raise
    _no_config_file(_config_arg(argv))
  except (flags.Error, KeyError, ValueError, AttributeError, TypeError) as e:
    print(f'error: {_sentence(e)}', file=sys.stderr)
    sys.exit(2)


def define_process_flags():
  """The multi-process flags of train.py and eval.py (lra.runtime.initialize):
  all three of --coordinator_address, --num_processes, --process_id (the
  same command on every process, each with its own id), or --distributed
  alone (JAX detects TPU pods and SLURM/Open MPI clusters)."""
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
  """lra.runtime.initialize from the flags of define_process_flags."""
  from lra import runtime  # pylint: disable=g-import-not-at-top

  f = flags.FLAGS
  return runtime.initialize(
    f.coordinator_address,
    f.num_processes,
    f.process_id,
    distributed=f.distributed,
    timeout_s=f.distributed_timeout,
  )


def exit_with_error(e):
  """Prints the one-sentence error and exits with status 2. In a
  multi-process run it leaves the message for the others (whose watchers,
  lra.runtime, print it and exit with 2 too) and ends at once (os._exit),
  skipping JAX's shutdown barrier that would wait for them."""
  print(f'error: {e}', file=sys.stderr, flush=True)
  import jax  # pylint: disable=g-import-not-at-top

  if jax.distributed.is_initialized():
    from lra import runtime  # pylint: disable=g-import-not-at-top

    runtime.publish_error(str(e))
    sys.stdout.flush()
    if jax.process_index() == 0:
      time.sleep(1.0)  # it runs the coordination service: let them read
    os._exit(2)  # pylint: disable=protected-access
  sys.exit(2)
