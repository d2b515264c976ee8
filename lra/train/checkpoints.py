"""Orbax checkpoints behind one small interface.

<workdir>/checkpoints/latest/<step>/  the last `keep` saves (for resuming)
<workdir>/checkpoints/best/<step>/    the best on validation accuracy (one)
<workdir>/checkpoints/records/        each save's file sizes (written after
                                      it), checked before it is read
<workdir>/checkpoints/unreadable/     saves found corrupt, moved aside (kept
                                      for inspection, never read again)
Each save holds the train state (params + optimizer, an nnx.State) and a JSON
`meta` item (step, best-so-far, validation metrics). Every process of a
multi-process run saves and restores (orbax: each its own shards, on a
filesystem all of them see); process 0 alone writes the records and moves
saves aside.

A save that cannot be read back (a truncated or missing file, a killed
copy) raises CheckpointError, one sentence; train.py then resumes from the
newest readable save with a warning naming what it skipped.
"""

import errno
import json
import logging
import os
import shutil

import jax
import orbax.checkpoint as ocp

from lra.errors import UserError

WHICH = ('latest', 'best')


class CheckpointError(UserError):
  """A checkpoint exists but cannot be read; `what` names it and the
  reason, without advice (callers add theirs)."""

  def __init__(self, what):
    super().__init__(f'{what}; move it away or use another one.')
    self.what = what


def _reason(e):
  """The first line of an orbax/tensorstore error, shortened."""
  text = str(e).strip().splitlines()
  text = text[0] if text else ''
  if 'TensorStore' in text or 'OUT_OF_RANGE' in text:
    return 'an array file is truncated or damaged'
  text = f'{type(e).__name__}: {text}' if text else type(e).__name__
  return text if len(text) <= 160 else text[:157] + '...'


def _file_sizes(step_dir):
  out = {}
  for folder, _, names in os.walk(step_dir):
    for name in names:
      path = os.path.join(folder, name)
      out[os.path.relpath(path, step_dir)] = os.path.getsize(path)
  return out


def _problem(step_dir, record_path):
  """Why a save is incomplete ('x is missing', 'x is truncated'), or None.
  Checked before orbax reads it: a missing or truncated file makes orbax's
  worker threads print tracebacks even when its error is caught. The record
  (every file's size, written after the save) exists for saves made by this
  version; older saves get the structural checks only."""
  need = ['state', os.path.join('meta', 'metadata')]
  if os.path.isdir(os.path.join(step_dir, 'state', 'ocdbt.process_0')):
    need.append(os.path.join('state', 'manifest.ocdbt'))
  for name in need:
    if not os.path.exists(os.path.join(step_dir, name)):
      return f'{name} is missing'
  if not os.path.exists(record_path):
    return None
  try:
    with open(record_path) as f:
      record = json.load(f)
  except (OSError, ValueError):
    return None  # a damaged record says nothing about the save
  sizes = _file_sizes(step_dir)
  for name, size in sorted(record.items()):
    if name not in sizes:
      return f'{name} is missing'
    if sizes[name] != size:
      return f'{name} is truncated or changed ({sizes[name]:,} bytes, ' + (
        f'{size:,} saved)'
      )
  return None


class CheckpointMismatch(UserError):
  """A readable checkpoint saved by a different model than the configured
  one: never moved aside, never overwritten (one sentence)."""


def _shapes(tree):
  """{'a.b.c': shape} of a pytree's array leaves (a trailing 'value' of
  nnx's variable states dropped), for comparing a save with a model."""
  out = {}
  for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
    if not hasattr(leaf, 'shape'):
      continue
    keys = [
      str(getattr(k, 'key', getattr(k, 'idx', getattr(k, 'name', k))))
      for k in path
    ]
    if keys and keys[-1] == 'value':
      keys.pop()
    out['.'.join(keys)] = tuple(leaf.shape)
  return out


def mismatch(step_dir, target):
  """'path: saved (a, b), this model (c, d)' of the first parameter where
  the save at step_dir and `target` (the named items) differ, or None (also
  when the save's metadata cannot be read: restoring then says why)."""
  logger = logging.getLogger('absl')  # orbax warns of absent step metadata
  level = logger.level
  logger.setLevel(logging.ERROR)
  try:
    meta = ocp.StandardCheckpointer().metadata(os.path.join(step_dir, 'state'))
    saved = _shapes(meta.item_metadata.tree)
  except Exception:  # pylint: disable=broad-except
    return None
  finally:
    logger.setLevel(level)
  if not saved or not all(k.split('.')[0] in ITEMS for k in saved):
    return None  # saved before the items were named: not compared
  want = _shapes(target)
  for key in sorted(set(saved) | set(want)):
    a, b = saved.get(key), want.get(key)
    if a != b:
      shown = lambda v: 'absent' if v is None else str(v)  # noqa: E731
      return f'{key}: saved {shown(a)}, this model {shown(b)}'
  return None


def _barrier(name):
  """Waits for every process (a no-op with one)."""
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top

    multihost_utils.sync_global_devices(name)


# The items of a saved run state: the model's state and the optimizer's
# (train.py's state is nnx.split((model, optimizer)), parts 0 and 1).
ITEMS = ('model', 'opt_state')


def named(state):
  """{'model': state[0], 'opt_state': state[1]}: the checkpoint's items."""
  return {ITEMS[0]: state[0], ITEMS[1]: state[1]}


def saved_steps(workdir):
  """{'latest': [...], 'best': [...]} from the directory names alone (opens
  no manager, creates nothing)."""
  out = {}
  for which in WHICH:
    path = os.path.join(workdir, 'checkpoints', which)
    names = os.listdir(path) if os.path.isdir(path) else []
    out[which] = sorted(int(n) for n in names if n.isdigit())
  return out


class Checkpoints:
  """Asynchronous saves: `save` returns once the state is copied off the
  device, and the files are written in the background while training goes
  on. The next save, a restore and `close` wait for it first (and then
  write its size record). Orbax writes into a temporary folder and renames
  it to <step> only once complete, so a save cut short (kill -9, full disk)
  never becomes the newest readable checkpoint: the previous one stays."""

  def __init__(self, workdir, keep=2, read_only=False):
    """read_only: open the saves for restoring only (load_run, eval.py):
    nothing is created or deleted, so a run on a read-only folder (an
    archive, a mount) opens, and one without checkpoints/ gets none."""
    self.root = os.path.abspath(os.path.join(workdir, 'checkpoints'))
    self.pending = None  # (which, step) of a save still being written
    self.read_only = read_only
    opts = lambda n: ocp.CheckpointManagerOptions(  # noqa: E731
      max_to_keep=n,
      create=not read_only,
      read_only=read_only,
      enable_async_checkpointing=not read_only,
    )
    logger = logging.getLogger('absl')  # orbax warns of read_only itself
    level = logger.level
    if read_only:
      logger.setLevel(logging.ERROR)
    try:
      self.latest = ocp.CheckpointManager(
        os.path.join(self.root, 'latest'), options=opts(keep)
      )
      self.best = ocp.CheckpointManager(
        os.path.join(self.root, 'best'), options=opts(1)
      )
    finally:
      logger.setLevel(level)

  def _manager(self, which):
    return {'latest': self.latest, 'best': self.best}[which]

  def path(self, which, step):
    return os.path.join(self.root, which, str(step))

  def record_path(self, which, step):
    """The save's file sizes, kept apart from orbax's folders."""
    return os.path.join(self.root, 'records', f'{which}_{step}.json')

  def _write_record(self, which, step):
    path = self.record_path(which, step)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + '.tmp', 'w') as f:
      json.dump(_file_sizes(self.path(which, step)), f, sort_keys=True)
    os.replace(path + '.tmp', path)
    kept = {f'{w}_{s}.json' for w in WHICH for s in self.all_steps(w)}
    for name in os.listdir(os.path.dirname(path)):
      if name.endswith('.json') and name not in kept:
        os.remove(os.path.join(os.path.dirname(path), name))

  def save(self, which, step, state, meta):
    """Starts saving (state, meta) as `which` at `step` (asynchronous; a
    save of a step already saved is skipped)."""
    self.wait()
    mngr = self._manager(which)
    if step in mngr.all_steps():
      return
    try:
      mngr.save(
        step,
        args=ocp.args.Composite(
          state=ocp.args.StandardSave(named(state)),
          meta=ocp.args.JsonSave(meta),
        ),
      )
    except Exception as e:  # pylint: disable=broad-except
      raise self._failed(which, step, e) from None
    self.pending = (which, step)

  def wait(self):
    """Waits for the save in flight, then writes its record; a save that
    failed (a full disk) is one sentence, the previous save intact."""
    if self.pending is None:
      return
    which, step = self.pending
    self.pending = None
    try:
      self._manager(which).wait_until_finished()
    except Exception as e:  # pylint: disable=broad-except
      raise self._failed(which, step, e) from None
    # Every process saves its shards (orbax); process 0 alone writes the
    # record, and the others wait for it.
    if jax.process_index() == 0:
      self._write_record(which, step)
    _barrier(f'checkpoint-record-{which}-{step}')

  def _failed(self, which, step, e):
    """The one sentence for a save that could not be written."""
    kept = self.all_steps(which) if which else []
    kept = [s for s in kept if s != step]
    previous = (
      f'the previous {which} checkpoint (step {max(kept)}) is intact'
      if kept
      else 'no earlier checkpoint was saved'
    )
    space = isinstance(e, OSError) and e.errno == errno.ENOSPC
    why = 'no space left on device' if space else _reason(e)
    advice = 'free some disk space' if space else 'fix the cause'
    return UserError(
      f'Saving the {which} checkpoint at step {step} under {self.root} '
      f'failed ({why}); {previous}: {advice} and run the same command to '
      'resume.'
    )

  def latest_step(self, which='latest'):
    return self._manager(which).latest_step()

  def all_steps(self, which='latest'):
    """The steps saved as `which` (a save in flight included)."""
    return list(self._manager(which).all_steps())

  def restore(self, which, step, abstract_state):
    """Restores (state, meta) with the shardings of `abstract_state`; raises
    CheckpointError when the save is corrupt or incomplete."""
    self.wait()
    target = jax.tree.map(
      lambda x: (
        ocp.utils.to_shape_dtype_struct(x) if hasattr(x, 'shape') else x
      ),
      abstract_state,
    )
    problem = _problem(self.path(which, step), self.record_path(which, step))
    if problem:
      raise CheckpointError(
        f'The {which} checkpoint at step {step} ({self.path(which, step)}) '
        f'is incomplete ({problem})'
      )
    differs = mismatch(self.path(which, step), named(target))
    if differs:
      raise CheckpointMismatch(
        f'The checkpoints in {self.root} were saved by another model '
        f'({differs}); give another --workdir, or run with the flags that '
        'made them (the checkpoints are left as they are).'
      )
    try:
      try:
        out = self._read(which, step, named(target))
      except Exception:  # pylint: disable=broad-except
        # Saved before the items were named: (model, optimizer) as '0', '1'.
        out = self._read(which, step, target)
      leaves = jax.tree.leaves(out['state'])
      state = jax.tree.unflatten(jax.tree.structure(target), leaves)
      meta = out['meta']
      if not isinstance(meta, dict) or 'step' not in meta:
        raise ValueError('its meta item is missing or incomplete')
    except Exception as e:  # pylint: disable=broad-except
      raise CheckpointError(
        f'The {which} checkpoint at step {step} ({self.path(which, step)}) '
        f'is unreadable ({_reason(e)})'
      ) from None
    return state, meta

  def _read(self, which, step, target):
    return self._manager(which).restore(
      step,
      args=ocp.args.Composite(
        state=ocp.args.StandardRestore(target), meta=ocp.args.JsonRestore()
      ),
    )

  def set_aside(self, which, step):
    """Moves an unreadable save to checkpoints/unreadable/<which>_<step>
    (kept, never read again); returns the new path."""
    self.wait()
    dest = os.path.join(self.root, 'unreadable', f'{which}_{step}')
    n = 1
    while os.path.exists(dest):
      n += 1
      dest = os.path.join(self.root, 'unreadable', f'{which}_{step}.{n}')
    # Every process found it unreadable (they read the same files); process
    # 0 moves it once they all have looked.
    _barrier(f'checkpoint-set-aside-{which}-{step}')
    if jax.process_index() == 0:
      os.makedirs(os.path.dirname(dest), exist_ok=True)
      shutil.move(self.path(which, step), dest)
      if os.path.exists(self.record_path(which, step)):
        shutil.move(
          self.record_path(which, step), os.path.join(dest, 'size_record.json')
        )
    _barrier(f'checkpoint-set-aside-done-{which}-{step}')
    self._manager(which).reload()
    return dest

  def close(self, quiet=False):
    """Waits for the save in flight (its error, if any, is raised after
    the managers are closed); quiet: after an error, close without raising
    another."""
    try:
      self.wait()
    except UserError:
      if not quiet:
        raise
    finally:
      for mngr in (self.latest, self.best):
        try:
          mngr.close()
        except Exception:  # pylint: disable=broad-except
          if not quiet:
            raise
