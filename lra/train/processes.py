"""Multi-process start-up and the cross-process error watcher.

`initialize` starts JAX's distributed runtime (explicit coordinator, or
detected on TPU pods / SLURM / Open MPI); `publish_error` leaves a failing
process's message for the others, whose watcher thread prints it and exits,
so no process waits in a collective for one that is gone. `is_primary` and
`barrier` are what the rest of the harness asks of the processes.
"""

import os
import sys
import threading
import time

import jax

from lra.errors import UserError


def initialize(
  coordinator_address=None,
  num_processes=None,
  process_id=None,
  distributed=False,
  timeout_s=300,
):
  """Starts JAX's distributed runtime before anything touches a device.

  All three of coordinator_address ('HOST:PORT', process 0's), num_processes
  and process_id given: those processes (e.g. on one machine, or hosts
  without a cluster manager). None given and `distributed`: JAX detects
  them (TPU pod slices, SLURM, Open MPI). Neither: one process, nothing to
  do. Cross-process collectives on CPU need gloo, set here. A process that
  cannot reach the others within `timeout_s` stops with one sentence.
  Returns the number of processes.
  """
  given = (coordinator_address, num_processes, process_id)
  if any(v is not None for v in given) and not all(
    v is not None for v in given
  ):
    raise UserError(
      'Give all three of --coordinator_address, --num_processes and '
      '--process_id, or none of them (--distributed then lets JAX detect '
      'a TPU pod slice or a SLURM/Open MPI cluster).'
    )
  explicit = coordinator_address is not None
  if not explicit and not distributed:
    return 1
  if explicit:
    host, _, port = coordinator_address.rpartition(':')
    if not host or not port.isdigit():
      raise UserError(
        f'--coordinator_address={coordinator_address} is not HOST:PORT; '
        "give process 0's address and a free port, e.g. 10.0.0.1:1234."
      )
    if num_processes < 1 or not 0 <= process_id < num_processes:
      raise UserError(
        f'--process_id={process_id} is not in 0..{num_processes - 1} '
        f'(--num_processes={num_processes}); number the processes from 0.'
      )
    if num_processes == 1:
      return 1
  platforms = jax.config.jax_platforms or ''
  if not platforms or 'cpu' in platforms.split(','):
    # Only the CPU client reads it; without it CPU collectives across
    # processes fail.
    jax.config.update('jax_cpu_collectives_implementation', 'gloo')
  kwargs = {}
  if explicit:
    kwargs = dict(
      coordinator_address=coordinator_address,
      num_processes=num_processes,
      process_id=process_id,
    )
  where = (
    f'the {num_processes} processes of coordinator {coordinator_address}'
    if explicit
    else 'the processes JAX detected'
  )
  advice = (
    'start every process with the same --coordinator_address and '
    '--num_processes and its own --process_id'
    if explicit
    else 'start the same command on every host'
  )

  def timed_out():
    # JAX aborts (a C++ check failure, no Python error) when the others do
    # not come: this one sentence comes first.
    print(
      f'error: {where} did not all start within {timeout_s} s; {advice} '
      '(or raise --distributed_timeout).',
      file=sys.stderr,
      flush=True,
    )
    os._exit(2)  # pylint: disable=protected-access

  timer = threading.Timer(timeout_s, timed_out)
  timer.daemon = True
  timer.start()
  try:
    jax.distributed.initialize(initialization_timeout=timeout_s + 60, **kwargs)
  except Exception as e:  # pylint: disable=broad-except
    first = (str(e).strip().splitlines() or [type(e).__name__])[0][:160]
    raise UserError(
      f'Could not start the distributed runtime with {where} ({first}); '
      f'{advice}.'
    ) from None
  finally:
    timer.cancel()
  _watch_for_errors()
  return jax.process_count()


# The key under which a failing process leaves its message for the others.
_ERROR_KEY = 'lra/error'


def _client():
  from jax._src import distributed  # pylint: disable=g-import-not-at-top

  return distributed.global_state.client


def publish_error(message):
  """Leaves `message` for the other processes (their watchers print it and
  exit); a no-op in a single-process run."""
  client = _client() if jax.distributed.is_initialized() else None
  if client is None:
    return
  try:
    client.key_value_set(
      _ERROR_KEY, f'process {jax.process_index()}: {message}'
    )
  except Exception:  # pylint: disable=broad-except
    pass  # another process failed first; its message stands


def _watch_for_errors(interval_s=0.5):
  """A daemon thread that ends this process (status 2) as soon as another
  one has published an error, so no process waits in a collective for one
  that is gone. JAX's heartbeat (100 s) still ends the others when a process
  dies without a word (killed, out of memory)."""
  client = _client()

  def watch():
    while True:
      try:
        message = client.key_value_try_get(_ERROR_KEY)
      except Exception:  # pylint: disable=broad-except
        message = None
      if message:
        if not message.startswith(f'process {jax.process_index()}:'):
          print(f'error: stopped: {message}', file=sys.stderr, flush=True)
          if jax.process_index() == 0:
            time.sleep(2 * interval_s)  # its service: let the others read
          os._exit(2)  # pylint: disable=protected-access
        return
      time.sleep(interval_s)

  threading.Thread(target=watch, name='lra-error-watch', daemon=True).start()


def warn(message: str) -> None:
  """`warning: message` on stderr, from process 0 only."""
  if is_primary():
    print(f'warning: {message}', file=sys.stderr, flush=True)


def is_primary():
  """True in process 0, the one that writes logs, results and the bar."""
  return jax.process_index() == 0


def barrier(name):
  """Waits for every process (a no-op with one)."""
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top

    multihost_utils.sync_global_devices(name)


def agree(flag: bool) -> bool:
  """Process 0's `flag`, for every process (a no-op with one): decisions
  that must be the same everywhere (a collective save at this step)."""
  if jax.process_count() == 1:
    return bool(flag)
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top

  return bool(multihost_utils.broadcast_one_to_all(np.asarray(flag)))
