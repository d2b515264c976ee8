"""Loss, train step and eval step, independent of the model zoo.

The model is any nnx.Module called as `model(inputs, key=...)` returning
(logits, aux) with aux['aux_loss'] a scalar. train.py builds it and hands it
here; lra/ never imports models/.
"""

import functools

from flax import nnx
import jax
import jax.numpy as jnp
import optax


def weighted_loss_and_metrics(logits_BxC, labels_B, weights_B):
  losses_B = optax.softmax_cross_entropy_with_integer_labels(
    logits_BxC, labels_B
  )
  correct_B = (jnp.argmax(logits_BxC, -1) == labels_B).astype(jnp.float32)
  return {
    'loss_sum': jnp.sum(losses_B * weights_B),
    'correct_sum': jnp.sum(correct_B * weights_B),
    'count': jnp.sum(weights_B),
  }


def learning_rate_schedule(config):
  """lr(step); the reference's rsqrt: base x min(1, s/w) / sqrt(max(s, w))."""
  base, warmup = config.learning_rate, max(config.warmup_steps, 1)
  if config.schedule == 'rsqrt':

    def rsqrt(step):
      step = jnp.asarray(step, jnp.float32)
      return (
        base
        * jnp.minimum(1.0, step / warmup)
        / jnp.sqrt(jnp.maximum(step, warmup))
      )

    return rsqrt
  if config.schedule == 'cosine':
    return optax.warmup_cosine_decay_schedule(
      0.0, base, warmup, max(config.num_train_steps, warmup + 1)
    )
  if config.schedule == 'constant':
    return optax.linear_schedule(0.0, base, warmup)
  raise ValueError(config.schedule)


def make_optimizer(config):
  parts = []
  if config.grad_clip_norm:
    parts.append(optax.clip_by_global_norm(config.grad_clip_norm))
  parts.append(
    optax.adamw(
      learning_rate_schedule(config),
      b1=config.adam_b1,
      b2=config.adam_b2,
      eps=config.adam_eps,
      weight_decay=config.weight_decay,
    )
  )
  tx = optax.chain(*parts)
  if config.grad_accum_steps > 1:
    tx = optax.MultiSteps(tx, every_k_schedule=config.grad_accum_steps)
  return tx


def make_train_step(graphdef):
  """jit(state, batch, key) -> (state, metrics); the state is donated."""

  @functools.partial(jax.jit, donate_argnums=0)
  def train_step(state, batch, key):
    model, optimizer = nnx.merge(graphdef, state)

    def loss_fn(model):
      logits, aux = model(batch['inputs'], key=key)
      m = weighted_loss_and_metrics(logits, batch['labels'], batch['weights'])
      loss = m['loss_sum'] / jnp.maximum(m['count'], 1) + aux['aux_loss']
      return loss, m

    (loss, metrics), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model)
    optimizer.update(model, grads)
    metrics['loss'] = loss
    metrics['grad_norm'] = optax.tree.norm(grads)
    return nnx.state((model, optimizer)), metrics

  return train_step


def make_eval_step(graphdef):
  """jit(state, batch) -> summed metrics (exact over weights)."""

  @jax.jit
  def eval_step(state, batch):
    model, _ = nnx.merge(graphdef, state)
    logits, _ = model(batch['inputs'], key=None)
    return weighted_loss_and_metrics(logits, batch['labels'], batch['weights'])

  return eval_step


def finish(sums):
  count = max(float(sums['count']), 1.0)
  return {
    'loss': float(sums['loss_sum']) / count,
    'accuracy': float(sums['correct_sum']) / count,
    'count': int(sums['count']),
  }
