"""Converting a trained `transformer` into a `longformer` (issue #21).

Beltagy, Peters and Cohan 2020 (arXiv 2004.05150, section 5) start
Longformer from a pretrained model, its global projections copied from the
ordinary ones. Here `--config.init_from` a transformer run loads its
encoder and keeps the Longformer's global maps at their identity
initialisation (lra/train/pretrained.py `init_from_missing`), so where the window
covers the input the converted model computes, before any step, exactly
what the transformer did.
"""

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_models_tasks import task_config

from lra import data as tasks
from lra.errors import UserError
from lra.train import build, pretrained, runtime
from lra.train.checkpoints import Checkpoints


def built(config):
  replicated, _ = runtime.make_mesh()
  return build.create_state(config, tasks.get_task('listops'), replicated)


def encoder_outputs(graphdef, state, tokens_BxL):
  model, _ = nnx.merge(graphdef, state)
  x_BxLxE, _, _ = jax.jit(lambda t: model.encoder(t))(tokens_BxL)
  return np.asarray(x_BxLxE, np.float64)


@pytest.fixture(scope='module')
def tokens_BxL():
  rng = np.random.default_rng(0)
  tokens = rng.integers(1, 16, (2, 64)).astype(np.int32)
  tokens[1, 37:] = 0  # padding
  return jnp.asarray(tokens)


@pytest.mark.slow
def test_transformer_run_converts_to_longformer_with_its_outputs(
  smoke_run, smoke_data_dir, tokens_BxL
):
  source = task_config('listops', 'transformer', data_dir=smoke_data_dir)
  graphdef, like = built(source)
  ckpt = Checkpoints(smoke_run)
  step = ckpt.latest_step('best')
  saved, _ = ckpt.restore('best', step, like)
  ckpt.close()
  want = encoder_outputs(graphdef, saved, tokens_BxL)

  # Window 512 covers the 65 tokens (CLS + 64); CLS pooling makes the CLS
  # global ('auto'), with its own (identity) global projections.
  config = task_config(
    'listops', 'longformer', data_dir=smoke_data_dir, init_from=smoke_run
  )
  graphdef, fresh = built(config)
  kept = pretrained.kept_when_missing(fresh)
  assert len(kept) == 6 and all('global_' in p[-1] for p in kept)
  state, got_step = build.init_from(config, fresh)
  assert got_step == step
  got = encoder_outputs(graphdef, state, tokens_BxL)
  np.testing.assert_allclose(got, want, atol=2e-5)
  # Not vacuous: the fresh longformer computes something else, and a
  # narrow window (a real Longformer) differs from the transformer.
  _, fresh_again = built(config)
  assert (
    np.abs(encoder_outputs(graphdef, fresh_again, tokens_BxL) - want).max()
    > 1e-2
  )
  narrow = task_config(
    'listops',
    'longformer',
    data_dir=smoke_data_dir,
    init_from=smoke_run,
    **{'model.attention.window': 8},
  )
  graphdef, state = built(narrow)
  state, _ = build.init_from(narrow, state)
  assert (
    np.abs(encoder_outputs(graphdef, state, tokens_BxL) - want).max() > 1e-3
  )


def test_a_parameter_missing_without_the_mark_is_still_one_sentence(
  smoke_run, smoke_data_dir
):
  config = task_config(
    'listops',
    'longformer',
    data_dir=smoke_data_dir,
    init_from=smoke_run,
    **{'model.num_layers': 2},
  )
  with pytest.raises(UserError, match=r'has no parameter encoder\.blocks\.1'):
    build.init_from(config, built(config)[1])
