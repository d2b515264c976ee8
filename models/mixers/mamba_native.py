"""Mamba's selective scan as a compiled CPU kernel (mamba_scan.cc), built
on first use.

The scan of models/mixers/mamba.py written in C++ and called from XLA as
two FFI custom calls (forward; backward with its own VJP): every one of
the X rows (batch x directions) runs its recurrence on an [N, I] state
that stays in the cache, the inner loops over I vectorised, exp included,
the rows split over the CPU's cores. The XLA form in mamba.py loops over
positions in XLA ops whose per-step cost dominates on a CPU (docs/
benchmark.md). Same recurrence, same float32 state, same checkpoints (the
state entering every `chunk_size` positions: memory linear in L).

Built once per machine into $LRA_CACHE_DIR (default ~/.cache/lra) with the
system's C++ compiler (`c++`, or $CXX; extra flags from
$LRA_MAMBA_CXXFLAGS) against jaxlib's FFI headers, -O3 -march=native
-ffast-math, named by a hash of the source, the flags, the compiler, the
jaxlib version and the CPU's model and flags (a cache shared by different
CPUs keeps one library each); a build writes a temp file and renames it
(parallel processes may build at once), with the library's sha256 in a
`.sha256` file beside it: a library is loaded only when its checksum
matches (a truncated one would kill the process with a Bus error), else it
is rebuilt. $LRA_MAMBA_THREADS caps its
threads.
Where no compiler works, or off the CPU, mamba.py keeps its XLA scan and
says once why (`available()`'s reason). `--config.model.attention.
scan_kernel=xla` chooses the XLA form everywhere.
"""

import ctypes
import functools
import hashlib
import logging
import os
import pathlib
import platform
import shutil
import subprocess
import tempfile

import jax
import jax.numpy as jnp
import jaxlib
import numpy as np

_SOURCE = pathlib.Path(__file__).with_name('mamba_scan.cc')
_FLAGS = (
  '-O3', '-march=native', '-mprefer-vector-width=512', '-ffast-math',
  '-std=c++17', '-shared', '-fPIC', '-pthread', '-w',
) + tuple(os.environ.get('LRA_MAMBA_CXXFLAGS', '').split())  # fmt: skip
_FORWARD, _BACKWARD = 'lra_mamba_scan_forward', 'lra_mamba_scan_backward'
_LOG = logging.getLogger(__name__)


def _cache_dir():
  root = os.environ.get('LRA_CACHE_DIR') or os.path.join(
    os.path.expanduser('~'), '.cache', 'lra'
  )
  return pathlib.Path(root)


def _cpu_signature():
  """The CPU's model and instruction-set flags: -march=native code built
  on one CPU may not run on another (a cache in a shared home folder)."""
  try:
    lines = pathlib.Path('/proc/cpuinfo').read_text().splitlines()
  except OSError:
    return platform.machine() + platform.processor()
  wanted = ('model name', 'flags', 'Features', 'CPU part')
  return ' '.join(sorted({x for x in lines if x.startswith(wanted)}))


def _stamp(library):
  """The file beside a built library holding its sha256 (hex), written by
  the build that made it."""
  return library.with_name(library.name + '.sha256')


def _digest(path):
  return hashlib.sha256(path.read_bytes()).hexdigest()


def _whole(library):
  """Whether a cached library is the one its build wrote: its sha256 equals
  its stamp's. Loading a truncated shared library (a build cut off by a
  full disk, a copied cache) is a Bus error that kills the process, so
  nothing is loaded unchecked; a library without a stamp (made before
  stamps, or its build cut off) is rebuilt."""
  try:
    return _stamp(library).read_text().strip() == _digest(library)
  except OSError:
    return False


def _write_atomically(path, data):
  """Writes `data` (bytes) to `path` through a temp file and a rename."""
  fd, tmp = tempfile.mkstemp(suffix='.tmp', dir=path.parent)
  try:
    os.chmod(tmp, 0o644)  # mkstemp's 0600 would hide it in a shared cache
    with os.fdopen(fd, 'wb') as f:
      f.write(data)
    os.replace(tmp, path)
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)


def _build():
  """Path of the compiled library (built if missing, rebuilt if its
  checksum does not match); raises OSError or
  subprocess.CalledProcessError with the compiler's message."""
  cxx = os.environ.get('CXX') or shutil.which('c++') or shutil.which('g++')
  if not cxx:
    raise OSError('no C++ compiler (c++ or g++) on PATH')
  source = _SOURCE.read_bytes()
  signature = ' '.join((*_FLAGS, jaxlib.__version__, cxx, _cpu_signature()))
  key = hashlib.sha256(source + signature.encode()).hexdigest()[:16]
  target = _cache_dir() / f'mamba_scan_{key}.so'
  if target.exists():
    if _whole(target):
      return target
    _LOG.warning(
      'mamba: the cached kernel %s is damaged or unchecked; rebuilding it.',
      target,
    )
  target.parent.mkdir(parents=True, exist_ok=True)
  fd, tmp = tempfile.mkstemp(suffix='.so', dir=target.parent)
  os.close(fd)
  try:
    command = [cxx, *_FLAGS, f'-I{jax.ffi.include_dir()}', str(_SOURCE)]
    command += ['-o', tmp, '-lmvec']
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode:  # libmvec missing: exp stays scalar
      command.remove('-lmvec')
      subprocess.run(command, capture_output=True, text=True, check=True)
    # The stamp first, then the library: a reader that finds the library
    # finds its stamp (a stale stamp only makes it rebuild).
    _write_atomically(
      _stamp(target), _digest(pathlib.Path(tmp)).encode() + b'\n'
    )
    os.replace(tmp, target)
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)
  return target


_REGISTERED = []  # the library whose handlers XLA calls (once a process)


@functools.cache
def available():
  """'' when the kernel is built and registered, else why not (one line)."""
  try:
    library = ctypes.CDLL(str(_build()))
    if not _REGISTERED:
      for name, symbol in (
        (_FORWARD, 'LraMambaScanForward'),
        (_BACKWARD, 'LraMambaScanBackward'),
      ):
        capsule = jax.ffi.pycapsule(getattr(library, symbol))
        jax.ffi.register_ffi_target(name, capsule, platform='cpu')
      _REGISTERED.append(library)
  except subprocess.CalledProcessError as error:
    lines = (error.stderr or '').strip().splitlines()
    said = lines[0] if lines else f'exit status {error.returncode}'
    return f'the C++ build ({error.cmd[0]}) failed: {said}'
  except (OSError, AttributeError) as error:
    return f'the C++ kernel could not be loaded: {error}'
  return ''


def _threads():
  """Threads the kernel splits its rows over: $LRA_MAMBA_THREADS, else
  the CPUs this process may run on (at most 32)."""
  value = os.environ.get('LRA_MAMBA_THREADS', '')
  if value.isdigit() and int(value) > 0:
    return int(value)
  if hasattr(os, 'sched_getaffinity'):
    cpus = len(os.sched_getaffinity(0))
  else:
    cpus = os.cpu_count() or 1
  return min(cpus, 32)


def _forward(a_XxNxI, u, dt, b, c, chunk):
  length, x, inner = u.shape
  kept = -(-length // chunk)
  f32 = jnp.float32
  return jax.ffi.ffi_call(
    _FORWARD,
    (
      jax.ShapeDtypeStruct(u.shape, f32),
      jax.ShapeDtypeStruct((kept, x, a_XxNxI.shape[1], inner), f32),
    ),
    vmap_method='sequential',
  )(u, dt, a_XxNxI, b, c, chunk=np.int64(chunk), threads=np.int64(_threads()))


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def _scan(a_XxNxI, u, dt, b, c, chunk):
  return _forward(a_XxNxI, u, dt, b, c, chunk)[0]


def _scan_fwd(a_XxNxI, u, dt, b, c, chunk):
  y, kept = _forward(a_XxNxI, u, dt, b, c, chunk)
  return y, (a_XxNxI, u, dt, b, c, kept)


def _scan_bwd(chunk, res, dy):
  a_XxNxI, u, dt, b, c, kept = res
  f32 = jnp.float32
  shapes = [u.shape, u.shape, a_XxNxI.shape, b.shape, c.shape]
  du, ddt, da, db, dc = jax.ffi.ffi_call(
    _BACKWARD,
    [jax.ShapeDtypeStruct(s, f32) for s in shapes],
    vmap_method='sequential',
  )(
    u, dt, a_XxNxI, b, c, kept, dy.astype(f32),
    chunk=np.int64(chunk), threads=np.int64(_threads()),
  )  # fmt: skip
  return da, du, ddt, db, dc


_scan.defvjp(_scan_fwd, _scan_bwd)


def scan_time_major(u_LxXxI, dt_LxXxI, a_XxNxI, b_LxXxN, c_LxXxN, chunk):
  """mamba.scan_time_major's contract, by the C++ kernel (available()
  must be ''): float32 [L, X, I]; one state kept per `chunk` positions."""
  length, x, _ = u_LxXxI.shape
  f32 = jnp.float32
  a_XxNxI = jnp.broadcast_to(a_XxNxI.astype(f32), (x, *a_XxNxI.shape[-2:]))
  return _scan(
    a_XxNxI,
    u_LxXxI.astype(f32),
    dt_LxXxI.astype(f32),
    b_LxXxN.astype(f32),
    c_LxXxN.astype(f32),
    max(1, min(int(chunk), length)),
  )
