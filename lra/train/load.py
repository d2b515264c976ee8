"""A trained run back in one call: `lra.load_run(workdir)`.

  from lra import load_run
  run = load_run('runs/listops')            # the best-validation checkpoint
  run.config.model.attention.name           # the run's locked config
  logits = run.predict(tokens_BxL)          # numpy [B, classes]
  run.evaluate('test')                      # {'loss', 'accuracy', 'count'}

`run.model` is the NNX model holding the checkpoint's weights (call it as
the steps do: `logits, aux = run.model(tokens, key=None)`). Works from any
directory once the project is installed (`pip install -e .`).
"""

import dataclasses
import os

from flax import nnx
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from lra import data as tasks
from lra.errors import UserError
from lra.train import build, rundir, runtime, steps
from lra.train.checkpoints import WHICH, CheckpointError, Checkpoints


@dataclasses.dataclass
class Run:
  """A trained run: its config, task, model (the checkpoint's weights) and
  which checkpoint they are ('best' or 'latest', and its step)."""

  workdir: str
  config: ml_collections.ConfigDict
  task: tasks.Task
  model: nnx.Module
  which: str
  step: int
  # (model, optimizer) as the steps take them: the eval step's input.
  graphdef: nnx.GraphDef = dataclasses.field(repr=False)
  state: nnx.State = dataclasses.field(repr=False)

  def predict(self, inputs) -> np.ndarray:
    """Logits of the model on a batch of token ids (int [B, L], padded with
    the task's pad id 0), as numpy. Deterministic (no dropout)."""
    inputs = jnp.asarray(inputs)
    if inputs.ndim != 2:
      raise UserError(
        f'predict takes token ids of shape [batch, length], got shape '
        f'{tuple(inputs.shape)}; add a batch axis (inputs[None]).'
      )
    graphdef, state = nnx.split(self.model)
    return np.asarray(_forward(graphdef, state, inputs))

  def evaluate(self, split: str = 'test') -> dict:
    """Exact loss and accuracy of the model on a whole split of its task's
    data (the same numbers as eval.py --split)."""
    if split not in ('train', 'val', 'test'):
      raise UserError(f'split must be train, val or test, got {split!r}.')
    data = runtime.load_data(self.config, self.task, progress=False)
    eval_step = steps.make_eval_step(self.graphdef)
    return runtime.evaluate(
      eval_step, self.state, data[split], self.config, None
    )


@jax.jit
def _forward(graphdef, state, inputs):
  return nnx.merge(graphdef, state)(inputs, key=None)[0]


def load_run(workdir: str, which: str = 'best', step: int | None = None) -> Run:
  """The run in `workdir` with the weights of its `which` checkpoint ('best':
  best validation, or 'latest') at `step` (default: the newest kept)."""
  path = os.path.join(workdir, 'config.json')
  saved = rundir.read_config(workdir) if os.path.exists(path) else None
  if saved is None:
    raise UserError(
      f'{path} is missing or unreadable; give the workdir of a run started '
      'by train.py.'
    )
  if which not in WHICH:
    raise UserError(f'which must be one of {", ".join(WHICH)}, got {which!r}.')
  config = ml_collections.ConfigDict(rundir.without_changes(saved))
  config.lock()
  task = tasks.get_task(config.task)
  graphdef, state = build.create_state(config, task, None)
  ckpt = Checkpoints(os.path.abspath(workdir), keep=config.keep_checkpoints)
  try:
    kept = ckpt.all_steps(which)
    if not kept or (step is not None and step not in kept):
      shown = ', '.join(map(str, kept)) or 'none'
      raise UserError(
        f'{workdir} has no {which} checkpoint'
        + (f' at step {step}' if step is not None else '')
        + f' (kept: {shown}); train it first or pick a kept step.'
      )
    step = max(kept) if step is None else step
    try:
      state, _ = ckpt.restore(which, step, state)
    except CheckpointError as e:
      raise UserError(f'{e.what}; train the run again.') from None
  finally:
    ckpt.close(quiet=True)
  model, _ = nnx.merge(graphdef, state)
  return Run(workdir, config, task, model, which, step, graphdef, state)
