"""Training objectives: classification, and self-pretraining on the inputs.

`config.objective`:
  'classify'   the task's labels (the LRA setting);
  'causal_lm'  next-token prediction under a causal mask (Mask.causal=True);
  'masked_lm'  BERT's denoising (Devlin et al. 2019, "BERT"): each real
               token is chosen with probability `config.mask_rate`
               (default 0.15); a chosen token becomes the mask id (80%), a
               random real token (10%) or stays (10%); the loss counts the
               chosen positions only.
  'per_position'  the task's own labels, one per position (a task with
               Task.per_position: mqar, lra/data/mqar.py): the data give
               labels [N, L] and lra/train/batching.py weights [N, L], 1 where a
               position is labelled, so the loss and the accuracy count the
               labelled positions only. The model is the LanguageModel
               (models/lm.py), causal when the task says so (mqar's form).
               Its metrics are a classification's ('accuracy' over the
               labelled positions; the best checkpoint has the highest
               validation accuracy); no length_schedule.

The LM objectives pretrain on the task's own training inputs, no labels,
as Amos, Berant and Gupta ("Never Train from Scratch", arXiv 2310.02980)
self-pretrain before fine-tuning. Retrieval's [B, 2, L] pairs become 2B
documents (each one an example). Padding is never chosen, never a target and
never in the loss.

The LM batch the model sees is {'inputs': int32 [N, L], 'labels': int32
[N, L] (the targets), 'weights': float32 [N, L] (1 where a position
counts)}, made on the host for causal_lm, in the step for masked_lm; the
model returns logits [N, L, V] aligned with the targets, so the
classification loss (lra.train.steps) applies unchanged. causal_lm: the target
at t is the token at t + 1 (counted when both are real), the last position
counts nothing.

The mask id is `vocab_size`: LM models have one more embedding row than the
task's vocabulary (models/lm.py); the head predicts the task's tokens only.

masked_lm's masks are drawn on the device, inside the jitted step
(`in_step`, lra/train/steps.py): the host sends the plain token ids and the row
weights, {'inputs': int32 [N, L], 'weights': float32 [N]}, and the step
makes the masked inputs, the targets and the counted positions. The draws
come from jax.random with the step's key, fold_in(fold_in(key(seed), 1),
step) (train.py; the dropout key) folded with a tag of its own, for
training, and from fold_in(fold_in(key(seed), tag), batch number) for an
evaluation batch (`eval_key`: the same masks at every evaluation of a
split). They are drawn for the whole global batch inside jit, so they do
not depend on the number of devices or processes, and a resumed run sees
the same masks.
"""

import jax
import jax.numpy as jnp
import numpy as np

from lra import data as tasks
from lra.errors import UserError

OBJECTIVES = ('classify', 'causal_lm', 'masked_lm', 'per_position')
LM_OBJECTIVES = ('causal_lm', 'masked_lm')
_TAG = 0x4D4C4D  # 'MLM': keeps the mask draws apart from dropout's
_EVAL_TAG = 0x4D4C45  # 'MLE': the evaluation batches' keys


def objective(config):
  """config.objective (configs made before it existed: 'classify')."""
  return config.get('objective', 'classify')


def is_lm(config):
  return objective(config) in LM_OBJECTIVES


def check(config):
  """One sentence for a bad objective or mask_rate, or an objective that
  does not fit the task's labels (per position or per example)."""
  name = objective(config)
  if name not in OBJECTIVES:
    raise UserError(
      f'--config.objective={name} is not one of {", ".join(OBJECTIVES)}; '
      'e.g. --config.objective=masked_lm.'
    )
  per_position = tasks.get_task(config.task).per_position
  if per_position and name != 'per_position':
    raise UserError(
      f'The {config.task} task has a label per position, which '
      f'--config.objective={name} does not read; use '
      '--config.objective=per_position.'
    )
  if name == 'per_position' and not per_position:
    raise UserError(
      f'--config.objective=per_position needs a task with a label per '
      f'position (mqar); {config.task} has one per example: use '
      '--config.objective=classify.'
    )
  if name == 'per_position' and config.get('length_schedule', ''):
    raise UserError(
      '--config.length_schedule crops the inputs but not the per-position '
      "labels of objective per_position; set --config.length_schedule=''."
    )
  rate = config.get('mask_rate', 0.15)
  ok = isinstance(rate, (int, float)) and not isinstance(rate, bool)
  if not (ok and 0.0 < rate <= 1.0):
    raise UserError(
      f'--config.mask_rate={rate} is out of range: it must be a number in '
      '(0, 1], e.g. --config.mask_rate=0.15.'
    )


def pad_id_of(config, task):
  """The id masked as padding (None: every token is real); as the model's
  builder decides it (models/classifier.py)."""
  if config.data.get('black_is_padding', False):
    return 0
  return task.pad_id


def mask_id(vocab_size):
  """The id masked_lm puts in place of a token: the row added to the
  embedding (models/lm.py)."""
  return vocab_size


def documents(inputs, weights):
  """[B, 2, L] pairs -> [2B, L] documents (each one an example; the row
  weights repeated); [B, L] unchanged."""
  inputs = np.asarray(inputs)
  if inputs.ndim == 3:
    b, d, length = inputs.shape
    return inputs.reshape(b * d, length), np.repeat(weights, d)
  return inputs, np.asarray(weights)


def real_of(tokens, pad_id):
  if pad_id is None:
    return np.ones(tokens.shape, bool)
  return tokens != pad_id


def causal_lm_batch(tokens_NxL, weights_N, pad_id):
  """Targets: the next token; weights: where this token and the next are
  real (times the row's weight)."""
  real_NxL = real_of(tokens_NxL, pad_id)
  labels_NxL = np.zeros_like(tokens_NxL)
  labels_NxL[:, :-1] = tokens_NxL[:, 1:]
  weights_NxL = np.zeros(tokens_NxL.shape, np.float32)
  weights_NxL[:, :-1] = real_NxL[:, :-1] & real_NxL[:, 1:]
  return {
    'inputs': tokens_NxL.astype(np.int32),
    'labels': labels_NxL.astype(np.int32),
    'weights': weights_NxL * weights_N[:, None],
  }


def masked_lm_batch(
  tokens_NxL, weights_N, key, *, vocab_size, pad_id, mask_rate
):
  """BERT's corruption, in jax (inside jit): each real token is chosen with
  probability mask_rate; a chosen one becomes the mask id (80%), a random
  real token (10%) or stays (10%). Targets: the tokens; weights: the chosen
  positions (times the row's weight)."""
  k_choose, k_kind, k_pick = jax.random.split(key, 3)
  shape = tokens_NxL.shape
  real_NxL = jnp.ones(shape, bool) if pad_id is None else tokens_NxL != pad_id
  chosen_NxL = real_NxL & (jax.random.uniform(k_choose, shape) < mask_rate)
  kind_NxL = jax.random.uniform(k_kind, shape)
  # A random real token: uniform over the ids other than the padding id.
  choices = vocab_size - (pad_id is not None)
  random_NxL = jax.random.randint(k_pick, shape, 0, choices, jnp.int32)
  if pad_id is not None:
    random_NxL = random_NxL + (random_NxL >= pad_id)
  inputs_NxL = jnp.where(
    chosen_NxL & (kind_NxL < 0.8),
    mask_id(vocab_size),
    jnp.where(chosen_NxL & (kind_NxL < 0.9), random_NxL, tokens_NxL),
  )
  weights_N = jnp.asarray(weights_N, jnp.float32)
  return {
    'inputs': inputs_NxL.astype(jnp.int32),
    'labels': jnp.asarray(tokens_NxL, jnp.int32),
    'weights': chosen_NxL.astype(jnp.float32) * weights_N[:, None],
  }


def in_step(config, task):
  """What the jitted steps do to a host batch before the model
  (lra/train/steps.py `prepare`): for masked_lm, fn(batch, key) -> the masked
  batch, the masks drawn from fold_in(key, tag) for the global batch; None
  for the other objectives (their batches are made on the host)."""
  if objective(config) != 'masked_lm':
    return None
  options = dict(
    vocab_size=task.vocab_size,
    pad_id=pad_id_of(config, task),
    mask_rate=float(config.mask_rate),
  )

  def prepare(batch, key):
    if key is None:
      raise ValueError('masked_lm draws its masks from the step key; got None')
    mask_key = jax.random.fold_in(key, _TAG)
    return masked_lm_batch(
      batch['inputs'], batch['weights'], mask_key, **options
    )

  return prepare


def eval_key(config, index):
  """The key of evaluation batch `index` (masked_lm; None otherwise): a
  function of (seed, index) only, so every evaluation of a split sees the
  same masks."""
  if objective(config) != 'masked_lm':
    return None
  base = jax.random.fold_in(jax.random.key(config.seed), _EVAL_TAG)
  return jax.random.fold_in(base, index)


def lm_batch(batch, config, task):
  """A classification batch (lra.train.batching) -> the objective's host batch:
  causal_lm's inputs, targets and weights; masked_lm's documents and row
  weights {'inputs': [N, L], 'weights': [N]}, masked in the step
  (`in_step`). Retrieval's [B, 2, L] pairs become 2B documents."""
  tokens_NxL, weights_N = documents(batch['inputs'], batch['weights'])
  if objective(config) == 'causal_lm':
    return causal_lm_batch(tokens_NxL, weights_N, pad_id_of(config, task))
  return {
    'inputs': np.asarray(tokens_NxL, np.int32),
    'weights': np.asarray(weights_N, np.float32),
  }


def finish(sums, config):
  """Summed metrics -> the objective's: classification and per_position
  {'loss', 'accuracy', 'count'} (per_position: over the labelled positions,
  count their number); LM {'loss', 'token_accuracy', 'count'} (count:
  the positions counted) and, for causal_lm, 'perplexity' = exp(loss)."""
  count = max(float(sums['count']), 1.0)
  loss = float(sums['loss_sum']) / count
  correct = float(sums['correct_sum']) / count
  if not is_lm(config):
    return {'loss': loss, 'accuracy': correct, 'count': int(sums['count'])}
  out = {'loss': loss, 'token_accuracy': correct, 'count': int(sums['count'])}
  if objective(config) == 'causal_lm':
    out['perplexity'] = float(np.exp(min(loss, 700.0)))
  return out


def accuracy_key(config):
  return 'token_accuracy' if is_lm(config) else 'accuracy'


def better(val, best, config):
  """Whether `val` beats the best evaluation so far: a higher accuracy for
  classification, a lower loss for the LM objectives."""
  if best['val'] is None and best['step'] is None:
    return True
  if is_lm(config):
    return best['val'] is None or val['loss'] < best['val']['loss']
  return val['accuracy'] > best['accuracy']


def describe(metrics, config):
  """'accuracy 0.5000 loss 1.2345' (LM: token accuracy, perplexity)."""
  if not is_lm(config):
    return f'accuracy {metrics["accuracy"]:.4f} loss {metrics["loss"]:.4f}'
  text = (
    f'token accuracy {metrics["token_accuracy"]:.4f} loss {metrics["loss"]:.4f}'
  )
  if 'perplexity' in metrics:
    text += f' perplexity {metrics["perplexity"]:.3f}'
  return text
