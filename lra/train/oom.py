"""Out of memory: the one detector, and the memory a program may use.

The training loop turns an out-of-memory step into one sentence; the step
and layer benchmarks record such a cell as 'OOM' and go on. All three ask
`out_of_memory`. XLA reports a failed allocation as an XlaRuntimeError
whose text holds RESOURCE_EXHAUSTED (GPU/TPU) or "Out of memory" (the CPU
client); the host's own failure is Python's MemoryError. A benchmark that
sees from XLA's compiled memory analysis that a program cannot fit raises
OutOfMemory before running it (a CPU host has no allocator limit, so
running it could take the machine down).
"""

import jax


class OutOfMemory(Exception):
  """A compiled program needs more memory than `memory_limit` allows."""


def out_of_memory(error: BaseException) -> bool:
  """Whether `error` says memory ran out (compiling or running a program)."""
  if isinstance(error, (OutOfMemory, MemoryError)):
    return True
  text = f'{type(error).__name__}: {error}'.lower()
  return 'resource_exhausted' in text or 'out of memory' in text


def memory_limit() -> int | None:
  """Bytes a program may use: the first local device's allocator limit
  (GPU/TPU), else the host's available memory (/proc/meminfo MemAvailable),
  else None (unknown)."""
  stats = jax.local_devices()[0].memory_stats() or {}
  if 'bytes_limit' in stats:
    return int(stats['bytes_limit'])
  try:
    with open('/proc/meminfo') as f:
      info = dict(line.split(':', 1) for line in f)
    return int(info['MemAvailable'].split()[0]) * 1024
  except (OSError, KeyError, ValueError):
    return None
