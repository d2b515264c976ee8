"""Orbax checkpoints behind one small interface.

<workdir>/checkpoints/latest/<step>/  the last `keep` saves (for resuming)
<workdir>/checkpoints/best/<step>/    the best on validation accuracy (one)
Each save holds the train state (params + optimizer, an nnx.State) and a JSON
`meta` item (step, best-so-far, validation metrics).
"""

import os

import jax
import orbax.checkpoint as ocp


class Checkpoints:
  def __init__(self, workdir, keep=2):
    root = os.path.abspath(os.path.join(workdir, 'checkpoints'))
    opts = lambda n: ocp.CheckpointManagerOptions(  # noqa: E731
      max_to_keep=n, create=True, enable_async_checkpointing=False
    )
    self.latest = ocp.CheckpointManager(
      os.path.join(root, 'latest'), options=opts(keep)
    )
    self.best = ocp.CheckpointManager(
      os.path.join(root, 'best'), options=opts(1)
    )

  def _manager(self, which):
    return {'latest': self.latest, 'best': self.best}[which]

  def save(self, which, step, state, meta):
    mngr = self._manager(which)
    if step in mngr.all_steps():
      return
    mngr.save(
      step,
      args=ocp.args.Composite(
        state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)
      ),
    )
    mngr.wait_until_finished()

  def latest_step(self, which='latest'):
    return self._manager(which).latest_step()

  def all_steps(self, which='latest'):
    return list(self._manager(which).all_steps())

  def restore(self, which, step, abstract_state):
    """Restores (state, meta) with the shardings of `abstract_state`."""
    target = jax.tree.map(
      lambda x: (
        ocp.utils.to_shape_dtype_struct(x) if hasattr(x, 'shape') else x
      ),
      abstract_state,
    )
    out = self._manager(which).restore(
      step,
      args=ocp.args.Composite(
        state=ocp.args.StandardRestore(target), meta=ocp.args.JsonRestore()
      ),
    )
    return out['state'], out['meta']

  def close(self):
    self.latest.close()
    self.best.close()
