"""glibc's malloc told to keep the memory a process frees (LRA_MALLOC).

Why: XLA's CPU runtime takes each execution's temporary buffers (one block
of hundreds of MB for a `small` training step) from malloc and frees them
when the step ends. glibc serves a block that large with its own mmap, or
from a thread's arena (heaps of 64 MiB that are mmapped pieces too), and
unmaps it on free; the next step maps it again and the kernel zero-fills
every page on first touch: one minor page fault per 4 KiB, every step, a
third of a CPU step's time spent in the kernel (issue 49).

What: `configure()` sets, with mallopt(3) before JAX allocates,
  M_ARENA_MAX = 1       every thread allocates from the main arena, the
                        one heap that grows with brk and is not made of
                        mmapped pieces,
  M_MMAP_MAX = 0        no allocation gets a mapping of its own,
  M_TRIM_THRESHOLD = -1 the top of the heap is never given back,
  M_TOP_PAD = 64 MiB    the heap grows in steps of at least that much,
so a freed block stays in the heap and the next step reuses its pages. The
process keeps its peak heap until it exits, as tcmalloc or jemalloc would.
lra/__init__.py calls it, so every entry point, the sweep's and the
benchmark's child processes (python -m lra...) and the test suite get it
before JAX starts its threads: threads that allocated before it keep arenas
of their own (import lra before creating JAX's CPU client).

LRA_MALLOC=system leaves glibc's defaults (the opt-out); it is inherited by
child processes. Where malloc is not glibc's (musl, macOS) or another
allocator is preloaded (LD_PRELOAD), nothing is set; on Linux without
glibc one line on stderr says how to get an allocator that keeps memory.
"""

import ctypes
import os
import sys

ENV = 'LRA_MALLOC'
# Set once the hint was printed, so child processes do not repeat it.
_NOTED_ENV = 'LRA_MALLOC_NOTED'

# mallopt(3) parameter numbers (glibc's malloc.h).
M_TRIM_THRESHOLD = -1
M_TOP_PAD = -2
M_MMAP_MAX = -4
M_ARENA_MAX = -8

SETTINGS = (
  (M_ARENA_MAX, 1),
  (M_MMAP_MAX, 0),
  (M_TRIM_THRESHOLD, -1),
  (M_TOP_PAD, 64 << 20),
)

# Allocators that keep freed memory by themselves: when one is preloaded,
# glibc's settings would not apply to the process's allocations anyway.
PRELOADED = ('tcmalloc', 'jemalloc', 'mimalloc')

HINT = (
  'note: malloc is not glibc, so each training step maps and unmaps its '
  'buffers (page faults); preload an allocator that keeps memory, e.g. '
  'LD_PRELOAD=libtcmalloc_minimal.so.4 (Debian/Ubuntu: apt-get install '
  'libtcmalloc-minimal4), or set LRA_MALLOC=system to silence this.'
)

_state = []


def glibc_version() -> str | None:
  """'2.36' where this process's C library is glibc, else None."""
  try:
    name = os.confstr('CS_GNU_LIBC_VERSION')
  except (AttributeError, ValueError, OSError):
    return None
  if not name or not name.startswith('glibc '):
    return None
  return name.split()[1]


def preloaded() -> str | None:
  """The keeping allocator named in LD_PRELOAD, if any."""
  for path in os.environ.get('LD_PRELOAD', '').replace(':', ' ').split():
    for name in PRELOADED:
      if name in os.path.basename(path):
        return name
  return None


def configure() -> str:
  """Applies the settings once per process; returns what happened:
  'keep' (set now or earlier), 'system' (LRA_MALLOC=system), 'preloaded'
  (LD_PRELOAD names tcmalloc, jemalloc or mimalloc), 'unsupported' (not
  glibc) or 'failed' (mallopt refused a setting: glibc's defaults stay for
  that one)."""
  if _state:
    return _state[0]
  _state.append(_configure())
  return _state[0]


def _configure() -> str:
  choice = os.environ.get(ENV, '').strip().lower()
  if choice == 'system':
    return 'system'
  if choice not in ('', 'keep'):
    # Not a UserError: this runs on import, before any entry point can
    # print one; an unknown value keeps the default and says so.
    _note(f'note: {ENV}={choice!r} is neither keep nor system; using keep.')
  if preloaded():
    return 'preloaded'
  if glibc_version() is None:
    if sys.platform.startswith('linux'):
      _note(HINT)
    return 'unsupported'
  try:
    mallopt = ctypes.CDLL('libc.so.6').mallopt
  except (OSError, AttributeError):
    return 'unsupported'
  mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
  mallopt.restype = ctypes.c_int
  ok = [mallopt(param, value) == 1 for param, value in SETTINGS]
  return 'keep' if all(ok) else 'failed'


def _note(line):
  if os.environ.get(_NOTED_ENV):
    return
  os.environ[_NOTED_ENV] = '1'
  print(line, file=sys.stderr)
