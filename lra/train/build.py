"""The model and optimizer state of a run: built fresh, from a pretrained
encoder (config.init_from), or rebuilt at another length (eval.py
--max_length, the longer test splits of mqar).

The one place in lra/train/ that calls models/ (models.classifier
.build_model): the loop, eval.py, benchmark.py and load_run all build their
state here.
"""

from flax import nnx
import jax
from ml_collections import ConfigDict

from lra import data as tasks
from lra.train import pretrained, steps
from models.classifier import build_model
from models.embeddings import fit_for_fine_tune


def create_state(
  config: ConfigDict, task: tasks.Task, replicated
) -> tuple[nnx.GraphDef, nnx.State]:
  """Model + optimizer -> (graphdef, replicated state)."""
  model = build_model(config, task)
  tx = steps.make_optimizer(config, model)
  optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
  graphdef, state = nnx.split((model, optimizer))
  return graphdef, jax.device_put(state, replicated)


def init_from(
  config: ConfigDict, state: nnx.State
) -> tuple[nnx.State, int | None]:
  """(state whose encoder is config.init_from's, the step read), or
  (state, None) without init_from (lra/train/pretrained.py). The learned
  position table is extended by copying (Longformer) when this run is longer (the
  CLS row stays first); a language model's extra token row (its mask id)
  is dropped (models.embeddings.fit_for_fine_tune)."""
  if not config.init_from:
    return state, None
  keep = int(config.model.pooling == 'cls')
  return pretrained.load_encoder(
    state,
    config.init_from,
    config.init_from_checkpoint,
    resize=lambda path, a, shape: fit_for_fine_tune(path, a, shape, keep),
  )


def at_length(
  config: ConfigDict,
  task: tasks.Task,
  replicated,
  state: nnx.State,
  max_length: int,
) -> tuple[nnx.GraphDef, nnx.State]:
  """(graphdef, state) of the same model built for `max_length`, with the
  parameters of `state` (eval.py --max_length): a learned position table is
  extended by copying its rows (Longformer); the optimizer state is fresh."""
  longer = config.copy_and_resolve_references()
  with longer.unlocked():
    longer.max_length = max_length
  graphdef, fresh = create_state(longer, task, replicated)
  keep = int(config.model.pooling == 'cls')
  return graphdef, pretrained.transplant(
    state,
    fresh,
    resize=lambda path, a, shape: fit_for_fine_tune(path, a, shape, keep),
    length=max_length,
  )
