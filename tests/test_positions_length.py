"""Relative and rotary positions evaluated past the trained length.

A model built (or, marked slow, trained one step) at length L is rebuilt
at 2L by build.at_length, the path of `eval.py --max_length` (same
parameters, fresh optimizer), for the exact transformer and the
segment-recurrent transformer_xl, under 'relative' (Transformer-XL's
logits, models/attention/relative.py) and 'rotary' (models/positions.py).
At 2L the outputs are finite and depend on the positions only through
offsets:
  - a classifier's logits for L real tokens after L padding tokens equal
    those for the same tokens alone at L (mean pooling, no CLS); with
    absolute 'sinusoidal' positions they differ (the check can fail);
  - a causal language model's first L outputs at 2L equal its outputs at L,
    and the outputs of the same L tokens after L padding tokens too.
Lengths are multiples of the recurrent model's segment (8), so its
segments line up under the shift.
"""

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import listops as listops_config
from lra import data as tasks
from lra.train import build, steps

L = 16
SEGMENT = 8
TASK = tasks.get_task('listops')
CASES = [
  ('transformer', 'relative'),
  ('transformer', 'rotary'),
  ('transformer_xl', 'relative'),
  ('transformer_xl', 'rotary'),
]


def config(model, positions, objective='classify'):
  """The ListOps smoke config of `model` at length L: no dropout, mean
  pooling (no CLS), the positions and objective given."""
  c = listops_config.get_config(f'{model},smoke')
  c.unlock()
  c.max_length = L
  c.objective = objective
  c.model.update(
    dict(
      positions=positions,
      pooling='mean',
      dropout_rate=0.0,
      attention_dropout_rate=0.0,
      segment_length=SEGMENT,
    )
  )
  return c


def tokens(shape, seed):
  """Random real ListOps ids (never the padding id 0)."""
  return jax.random.randint(jax.random.key(seed), shape, 1, TASK.vocab_size)


def at_2l(c, state):
  """(model at 2L, its (graphdef, state)) with the parameters of `state`,
  by eval.py's build.at_length."""
  graphdef, state_2l = build.at_length(c, TASK, None, state, 2 * L)
  model_2l, _ = nnx.merge(graphdef, state_2l)
  return model_2l, (graphdef, state_2l)


def left_padded(t_BxL):
  """[B, 2L]: L padding tokens, then t."""
  return jnp.concatenate([jnp.zeros_like(t_BxL), t_BxL], 1)


def logits(model, *inputs):
  """The model's first output on each input, in one jitted call per
  length (inputs of one length are stacked on the batch)."""
  x = jnp.concatenate(inputs, 0)
  out = np.asarray(jax.jit(lambda x: model(x)[0])(x))
  return np.split(out, len(inputs), 0)


@pytest.mark.parametrize(
  'model,positions', CASES + [('transformer', 'sinusoidal')]
)
def test_classifier_at_2l_is_finite_and_shift_invariant(model, positions):
  c = config(model, positions)
  graphdef, state = build.create_state(c, TASK, None)
  short, _ = nnx.merge(graphdef, state)
  long, _ = at_2l(c, state)
  t = tokens((3, L), 1)
  (want,) = logits(short, t)
  got, other = logits(long, left_padded(t), tokens((3, 2 * L), 2))
  assert np.all(np.isfinite(got)) and np.all(np.isfinite(other))
  if positions == 'sinusoidal':  # absolute: the shift is seen
    assert np.abs(got - want).max() > 1e-3
  else:
    np.testing.assert_allclose(got, want, atol=2e-5)


@pytest.mark.slow  # a compiled training step: ~10 s of CPU
def test_trained_at_l_evaluates_at_2l_through_the_eval_step():
  """One training step at L, then eval.py's step (steps.make_eval_step) on
  the model rebuilt at 2L: a finite loss over every example."""
  c = config('transformer_xl', 'rotary')
  graphdef, state = build.create_state(c, TASK, None)
  batch = {
    'inputs': tokens((4, L), 0),
    'labels': jnp.arange(4) % TASK.num_classes,
    'weights': jnp.ones((4,)),
  }
  state, metrics = steps.make_train_step(graphdef)(state, batch, None)
  assert np.isfinite(metrics['loss'])
  _, (graphdef_2l, state_2l) = at_2l(c, state)
  long_batch = {**batch, 'inputs': tokens((4, 2 * L), 2).at[1, 20:].set(0)}
  sums = steps.make_eval_step(graphdef_2l)(state_2l, long_batch)
  assert np.isfinite(float(sums['loss_sum'])) and int(sums['count']) == 4


@pytest.mark.parametrize('model,positions', CASES)
def test_causal_lm_at_2l_first_outputs_equal_those_at_l(model, positions):
  c = config(model, positions, objective='causal_lm')
  graphdef, state = build.create_state(c, TASK, None)
  short, _ = nnx.merge(graphdef, state)
  long, _ = at_2l(c, state)
  t_Bx2L = tokens((2, 2 * L), 3)
  got, shifted = logits(long, t_Bx2L, left_padded(t_Bx2L[:, :L]))
  assert got.shape == (2, 2 * L, TASK.vocab_size)
  assert np.all(np.isfinite(got))
  (want,) = logits(short, t_Bx2L[:, :L])
  np.testing.assert_allclose(got[:, :L], want, atol=2e-5)
  np.testing.assert_allclose(shifted[:, L:], want, atol=2e-5)
