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
               Task.per_position: mqar, lra/tasks/mqar.py): the data give
               labels [N, L] and lra/batching.py weights [N, L], 1 where a
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

An LM batch is {'inputs': int32 [N, L], 'labels': int32 [N, L] (the
targets), 'weights': float32 [N, L] (1 where a position counts)}; the model
returns logits [N, L, V] aligned with the targets, so the classification
loss (lra.steps) applies unchanged. causal_lm: the target at t is the token
at t + 1 (counted when both are real), the last position counts nothing.

The mask id is `vocab_size`: LM models have one more embedding row than the
task's vocabulary (models/lm.py); the head predicts the task's tokens only.

The masked positions and replacements are a function of (seed, step) for a
training batch and of (seed, batch number) for an evaluation batch, drawn
for the whole global batch before a process takes its rows, so they do not
depend on the number of processes and a resumed run sees the same masks.
"""

import numpy as np

from lra import tasks
from lra.errors import UserError

OBJECTIVES = ('classify', 'causal_lm', 'masked_lm', 'per_position')
LM_OBJECTIVES = ('causal_lm', 'masked_lm')
_STREAM = {'train': 0, 'eval': 1}
_TAG = 0x4D4C4D  # 'MLM': keeps these draws apart from the data order's


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
  tokens_NxL, weights_N, draws_3xNxL, *, vocab_size, pad_id, mask_rate
):
  """BERT's corruption from uniform draws in [0, 1): draws[0] chooses the
  positions, draws[1] the replacement kind, draws[2] the random token."""
  choose, kind, pick = draws_3xNxL
  chosen_NxL = real_of(tokens_NxL, pad_id) & (choose < mask_rate)
  # A random real token: uniform over the ids other than the padding id.
  choices = vocab_size - (pad_id is not None)
  random_NxL = np.minimum((pick * choices).astype(np.int64), choices - 1)
  if pad_id is not None:
    random_NxL = random_NxL + (random_NxL >= pad_id)
  inputs_NxL = np.where(
    chosen_NxL & (kind < 0.8),
    mask_id(vocab_size),
    np.where(chosen_NxL & (kind < 0.9), random_NxL, tokens_NxL),
  )
  return {
    'inputs': inputs_NxL.astype(np.int32),
    'labels': np.asarray(tokens_NxL, np.int32),
    'weights': chosen_NxL.astype(np.float32) * weights_N[:, None],
  }


def draws(seed, stream, index, global_rows, length, rows):
  """Uniform [3, rows, length] draws of a global batch of `global_rows`
  documents at (seed, stream, index); `rows` (a slice) the process's."""
  rng = np.random.default_rng([seed, _STREAM[stream], index, _TAG])
  return rng.random((3, global_rows, length), np.float32)[:, rows]


def lm_batch(
  batch, config, task, *, stream, index, rows=None, global_batch=None
):
  """A classification batch (lra.batching) -> the objective's LM batch.

  stream: 'train' (index: the step) or 'eval' (index: the batch number);
  rows: the process's example rows of the global batch of `global_batch`
  examples (default: all of them, one process)."""
  tokens_NxL, weights_N = documents(batch['inputs'], batch['weights'])
  pad_id = pad_id_of(config, task)
  if objective(config) == 'causal_lm':
    return causal_lm_batch(tokens_NxL, weights_N, pad_id)
  docs = task.num_inputs
  n = len(batch['weights'])
  global_batch = n if global_batch is None else global_batch
  rows = slice(0, n) if rows is None else rows
  doc_rows = slice(rows.start * docs, rows.stop * docs)
  u = draws(
    config.seed,
    stream,
    index,
    global_batch * docs,
    tokens_NxL.shape[1],
    doc_rows,
  )
  return masked_lm_batch(
    tokens_NxL,
    weights_N,
    u,
    vocab_size=task.vocab_size,
    pad_id=pad_id,
    mask_rate=config.mask_rate,
  )


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
