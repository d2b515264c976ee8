"""A trained run back in one call: `lra.load_run(workdir)`; the one way the
project opens a run's checkpoint (eval.py is built on it).

  from lra import load_run
  run = load_run('runs/listops')            # the best-validation checkpoint
  run.config.model.attention.name           # the run's locked config
  logits = run.predict(tokens_BxL)          # numpy [B, classes]
  run.evaluate('test')                      # {'loss', 'accuracy', 'count'}

`run.model` is the NNX model holding the checkpoint's weights (call it as
the steps do: `logits, aux = run.model(tokens, key=None)`). The workdir is
a path (a relative one is read from the working directory); this works
from any directory once the project is installed (`pip install .`).

A step is looked up in the checkpoint set asked for, then in the other one
(the best step may be gone from `latest`, a late step is only there);
every failure is one sentence (UserError) naming the saved steps.
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
from lra.train import build, objectives, rundir, runtime, steps
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
  # The batch sharding of the mesh the state was placed on (None: one
  # device, placed by jit).
  batch_sharding: object = dataclasses.field(default=None, repr=False)

  def predict(self, inputs) -> np.ndarray:
    """Logits of the model on a batch of token ids (int [B, L], padded with
    the task's pad id 0; [B, 2, L] for a task of two documents), as numpy.
    Deterministic (no dropout). Ids outside the vocabulary, a float array,
    another shape or a length past the run's max_length are one sentence
    (an embedding lookup would give NaN or wrap around silently)."""
    inputs = _checked_ids(inputs, self.config, self.task)
    graphdef, state = nnx.split(self.model)
    return np.asarray(_forward(graphdef, state, jnp.asarray(inputs)))

  def evaluate(self, split: str = 'test', progress: bool = False) -> dict:
    """Exact metrics of the model on a whole split of its task's data
    (classification: loss, accuracy, count; an LM objective: its loss and
    token accuracy), as eval.py --split reports them; progress: show the
    data preparation and a bar."""
    if split not in ('train', 'val', 'test'):
      raise UserError(f'split must be train, val or test, got {split!r}.')
    data = runtime.load_data(self.config, self.task, progress=progress)
    eval_step = steps.make_eval_step(
      self.graphdef, objectives.in_step(self.config, self.task)
    )
    return runtime.evaluate(
      eval_step,
      self.state,
      data[split],
      self.config,
      self.batch_sharding,
      desc=split if progress else '',
    )

  def at_length(self, max_length: int, replicated=None) -> 'Run':
    """The run with its model built at another input length (a learned
    position table extended by copying its trained rows,
    lra/train/build.py at_length; UserError where a parameter depends on
    the length)."""
    if max_length == self.config.max_length:
      return self
    graphdef, state = build.at_length(
      self.config, self.task, replicated, self.state, max_length
    )
    config = self.config.copy_and_resolve_references()
    with config.unlocked():
      config.max_length = max_length
    config.lock()
    model, _ = nnx.merge(graphdef, state)
    return dataclasses.replace(
      self, config=config, model=model, graphdef=graphdef, state=state
    )


def _checked_ids(inputs, config, task) -> np.ndarray:
  """`inputs` as an int32 array of token ids that `task`'s model under
  `config` takes, or UserError naming what is wrong (the shape, the dtype,
  the first id outside [0, vocabulary) with its place)."""
  docs = task.num_inputs
  shape = '[batch, length]' if docs == 1 else f'[batch, {docs}, length]'
  try:
    ids = np.asarray(inputs)
  except (ValueError, TypeError) as e:  # ragged lists
    raise UserError(
      f'predict takes token ids of shape {shape}, got an array it cannot '
      f'read ({e}).'
    ) from None
  if ids.ndim != (2 if docs == 1 else 3) or (docs > 1 and ids.shape[1] != docs):
    raise UserError(
      f'predict takes token ids of shape {shape}, got shape '
      f'{tuple(ids.shape)}'
      + ('; add a batch axis (inputs[None]).' if ids.ndim < 2 else '.')
    )
  if ids.size == 0:
    raise UserError(f'predict got an empty batch of shape {ids.shape}.')
  if ids.dtype.kind not in 'iu':
    raise UserError(
      f'predict takes integer token ids, got dtype {ids.dtype}; convert '
      'them (np.asarray(ids, np.int32)) if they are whole numbers.'
    )
  if ids.shape[-1] > config.max_length:
    raise UserError(
      f'predict got inputs of length {ids.shape[-1]}, longer than the '
      f"run's max_length {config.max_length}; crop them, or take "
      'run.at_length(n) (a model built for length n).'
    )
  objective = config.get('objective', 'classify')
  vocab = (
    task.vocab_size_for(config.data.to_dict())
    if objective == 'per_position' or task.per_position
    else task.vocab_size
  )
  bad = (ids < 0) | (ids >= vocab)
  if bad.any():
    place = tuple(int(i) for i in np.argwhere(bad)[0])
    raise UserError(
      f'predict got token id {int(ids[place])} at {list(place)}, outside '
      f"the vocabulary [0, {vocab}) of the run's {config.task} task; "
      f'give ids below {vocab} (0 is padding).'
    )
  return ids.astype(np.int32)


@jax.jit
def _forward(graphdef, state, inputs):
  return nnx.merge(graphdef, state)(inputs, key=None)[0]


def saved_config(workdir: str) -> ml_collections.ConfigDict:
  """The run's config as train.py saved it (config.json, without its
  resume records), unlocked; UserError when there is none."""
  path = os.path.join(workdir, rundir.CONFIG)
  if not os.path.exists(path):
    raise UserError(
      f'{path} does not exist; give the workdir of a run started by train.py.'
    )
  saved = rundir.read_config(workdir)
  if saved is None:
    raise UserError(
      f'{path} is not a readable config (not a JSON object); give the '
      'workdir of a run started by train.py.'
    )
  return ml_collections.ConfigDict(rundir.without_changes(saved))


def _saved(ckpt: Checkpoints) -> str:
  latest, best = ckpt.all_steps('latest'), ckpt.all_steps('best')
  return f'saved: latest {latest}, best {best}'


def find_step(ckpt: Checkpoints, workdir: str, which: str, step: int | None):
  """(which, step) of the checkpoint to open: the newest of `which`, or
  `step` in `which` or else in the other set; UserError naming the saved
  steps when there is none."""
  if which not in WHICH:
    raise UserError(f'which must be one of {", ".join(WHICH)}, got {which!r}.')
  if step is None:
    kept = ckpt.all_steps(which)
    if kept:
      return which, max(kept)
    raise UserError(
      f'{workdir} has no {which} checkpoint ({_saved(ckpt)}); train the '
      'run first.'
    )
  for w in (which, *(w for w in WHICH if w != which)):
    if step in ckpt.all_steps(w):
      return w, step
  raise UserError(
    f'{workdir} has no checkpoint at step {step} ({_saved(ckpt)}); give '
    'a saved step.'
  )


def load_run(
  workdir: str,
  which: str = 'best',
  step: int | None = None,
  *,
  config: ml_collections.ConfigDict | None = None,
  shardings: tuple | None = None,
) -> Run:
  """The run in `workdir` with the weights of its `which` checkpoint ('best':
  best validation, or 'latest') at `step` (default: the newest kept; a
  step not in `which` is looked for in the other set). config: the run's
  saved config with changes that keep the parameters' shapes (eval.py's
  --data_dir and attention options; default: saved_config). shardings:
  (replicated, batch) of a mesh to place the state on
  (lra/train/runtime.py make_mesh; default: one device)."""
  if which not in WHICH:
    raise UserError(f'which must be one of {", ".join(WHICH)}, got {which!r}.')
  config = saved_config(workdir) if config is None else config
  config.lock()
  task = tasks.get_task(config.task)
  replicated, batch_sharding = shardings or (None, None)
  graphdef, state = build.create_state(config, task, replicated)
  # Read-only: opening a run writes nothing in it (an archived run, a
  # read-only mount, a folder of someone else's).
  ckpt = Checkpoints(
    os.path.abspath(workdir), keep=config.keep_checkpoints, read_only=True
  )
  try:
    which, step = find_step(ckpt, workdir, which, step)
    try:
      state, _ = ckpt.restore(which, step, state)
    except CheckpointError as e:
      raise UserError(
        f'{e.what}; evaluate another saved one ({_saved(ckpt)}) or train '
        'the run again.'
      ) from None
  finally:
    ckpt.close(quiet=True)
  model, _ = nnx.merge(graphdef, state)
  return Run(
    workdir, config, task, model, which, step, graphdef, state, batch_sharding
  )
