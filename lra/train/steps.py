"""Loss, train step and eval step, independent of the model zoo.

The model is any nnx.Module called as `model(inputs, key=...)` returning
(logits, aux) with aux['aux_loss'] a scalar. train.py builds it and hands it
here; lra/ never imports models/.
"""

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


def _clipped(tx, max_norm):
  """`tx` after clipping to a global norm, with exactly `tx`'s state, so
  turning clipping on or off keeps the optimizer state's structure (a run
  can resume with another --config.grad_clip_norm)."""
  clip = optax.clip_by_global_norm(max_norm)

  def update(updates, state, params=None):
    updates, _ = clip.update(updates, optax.EmptyState(), params)
    return tx.update(updates, state, params)

  return optax.GradientTransformation(tx.init, update)


def ssm_parameter_paths(model):
  """The paths (tuples of attribute names and indices, as nnx.iter_graph
  gives them) of the parameters the model's modules list in their
  `ssm_params` (models/mixers/base.py: a state-space mixer's A, B, dt)."""
  paths = set()
  for path, node in nnx.iter_graph(model):
    for name in getattr(type(node), 'ssm_params', ()):
      if isinstance(getattr(node, name, None), nnx.Param):
        paths.add((*path, name))
  return frozenset(paths)


def _path_key(entry):
  for field in ('key', 'idx', 'name'):
    if hasattr(entry, field):
      return getattr(entry, field)
  return entry


def parameter_key(path):
  """A pytree path of the optimised state -> the parameter's path as
  ssm_parameter_paths writes it (a Variable's trailing 'value' dropped)."""
  keys = tuple(_path_key(e) for e in path)
  return keys[:-1] if keys and keys[-1] == 'value' else keys


def _grouped_adamw(config, schedule, ssm_paths):
  """optax.adamw with two parameter groups: the parameters at ssm_paths
  take ssm_learning_rate / learning_rate times the schedule's rate and
  weight decay ssm_weight_decay; every other one is exactly adamw's. The
  state has adamw's structure (Adam's moments, an empty state, the step
  count), so a run resumes with the groups switched on or off."""
  ratio = config.ssm_learning_rate / config.learning_rate
  wd, ssm_wd = config.weight_decay, config.ssm_weight_decay

  def in_group(path):
    return parameter_key(path) in ssm_paths

  def update(updates, state, params):
    rate = schedule(state.count)

    def one(path, u, p):
      if in_group(path):
        return -rate * ratio * (u + ssm_wd * p)
      return -rate * (u + wd * p)

    updates = jax.tree_util.tree_map_with_path(one, updates, params)
    return updates, optax.ScaleByScheduleState(
      count=optax.safe_increment(state.count)
    )

  def init(params):
    del params
    return optax.ScaleByScheduleState(count=jnp.zeros([], jnp.int32))

  return optax.chain(
    optax.scale_by_adam(
      b1=config.adam_b1, b2=config.adam_b2, eps=config.adam_eps
    ),
    optax.identity(),
    optax.GradientTransformation(init, update),
  )


def make_optimizer(config, model=None):
  """AdamW on the schedule, after optional clipping. Only closures depend on
  the optimiser settings (learning rate, schedule, warmup, weight decay,
  Adam's constants, clipping, the SSM group's rate and decay), never the
  state's structure, so a run resumes with changed settings
  (lra.train.rundir.OPTIMISER_CHANGES).

  config.ssm_learning_rate > 0 (and a model whose modules list
  `ssm_params`): those parameters train at that peak rate (on the same
  schedule) with config.ssm_weight_decay, as the S4, S5 and Mamba authors
  train them; 0 (the default): one group, plain AdamW."""
  schedule = learning_rate_schedule(config)
  ssm_lr = config.get('ssm_learning_rate', 0.0)
  ssm_paths = ssm_parameter_paths(model) if model is not None else ()
  if ssm_lr > 0 and ssm_paths:
    tx = _grouped_adamw(config, schedule, ssm_paths)
  else:
    tx = optax.adamw(
      schedule,
      b1=config.adam_b1,
      b2=config.adam_b2,
      eps=config.adam_eps,
      weight_decay=config.weight_decay,
    )
  if config.grad_clip_norm:
    tx = _clipped(tx, config.grad_clip_norm)
  tx = optax.chain(tx)  # the structure runs saved before clipping moved
  if config.grad_accum_steps > 1:
    tx = optax.MultiSteps(tx, every_k_schedule=config.grad_accum_steps)
  return tx


def step_key(seed, step):
  """The random key of training step `step` (counted from 1) of a run with
  `seed`: fold_in(fold_in(key(seed), 1), step). The same bits eagerly and
  inside jit (threefry is a pure function of its inputs)."""
  return jax.random.fold_in(jax.random.fold_in(jax.random.key(seed), 1), step)


# The fields of a packed metrics row (make_train_step's packed_lr), in order.
ROW = (
  'loss',
  'grad_norm',
  'correct_sum',
  'count',
  'params_finite',
  'learning_rate',
)


def batch_loss(model, batch, key=None):
  """(the training loss of `batch`: mean over its weights plus the model's
  aux loss, the summed metrics); key None: no dropout."""
  logits, aux = model(batch['inputs'], key=key)
  m = weighted_loss_and_metrics(logits, batch['labels'], batch['weights'])
  return m['loss_sum'] / jnp.maximum(m['count'], 1) + aux['aux_loss'], m


def make_train_step(
  graphdef, prepare=None, seed=None, shardings=None, packed_lr=None
):
  """jit(state, batch, key=None) -> (state, metrics); the state is donated.
  prepare(batch, key), when given, makes the model's batch from the host's
  inside the step (lra.train.objectives.in_step: masked_lm's masks).

  key None with a seed (train.py's loop): the step draws its own key,
  step_key(seed, s) for its step s = the optimizer's update count + 1 (one
  update per call, grad accumulation included), so the host neither computes
  nor transfers a key per step and a resumed run meets the same keys.
  Without a seed, key None is no key (no dropout).

  shardings = (state sharding, batch sharding): jit(state, batch) with
  these in_shardings, so the batch may be given as host (numpy) arrays: the
  step's dispatch places them (one process only: host arrays are then the
  global batch). train.py's loop does so on CPU, where a separate
  device_put costs about a tenth of a small model's step.

  packed_lr = (schedule, grad_accum_steps) (train.py's loop): the metrics
  come back as one float32 vector in ROW order, a single
  output to read instead of six, with the learning rate the optimiser
  applies at this step, schedule(update count // grad_accum_steps), so the
  host evaluates no schedule either (an eager evaluation per step would
  cost host time)."""

  def train_step(state, batch, key=None):
    model, optimizer = nnx.merge(graphdef, state)
    calls = optimizer.step[...]  # the updates before this one
    if key is None and seed is not None:
      key = step_key(seed, calls + 1)
    if prepare is not None:
      batch = prepare(batch, key)

    (loss, metrics), grads = nnx.value_and_grad(batch_loss, has_aux=True)(
      model, batch, key
    )
    optimizer.update(model, grads)
    metrics['loss'] = loss
    metrics['grad_norm'] = optax.tree.norm(grads)
    new_state = nnx.state((model, optimizer))
    # An update can blow the parameters up with a finite loss (the next
    # step's is not); train.py stops at the step whose update did it, so no
    # checkpoint holds such parameters. Their squared norm overflows float32
    # long before they are inf.
    metrics['params_finite'] = jnp.isfinite(
      optax.tree.norm(nnx.state(model, nnx.Param), squared=True)
    )
    if packed_lr is not None:
      schedule, accum = packed_lr
      metrics['learning_rate'] = schedule(calls // max(accum, 1))
      metrics = jnp.stack([metrics[k].astype(jnp.float32) for k in ROW])
    return new_state, metrics

  if shardings is None:
    return jax.jit(train_step, donate_argnums=0)
  return jax.jit(
    lambda state, batch: train_step(state, batch),
    donate_argnums=0,
    in_shardings=shardings,
  )


def make_eval_step(graphdef, prepare=None):
  """jit(state, batch, key=None) -> summed metrics (exact over weights);
  prepare as make_train_step's, with the batch's key (lra.train.objectives
  eval_key)."""

  @jax.jit
  def eval_step(state, batch, key=None):
    model, _ = nnx.merge(graphdef, state)
    if prepare is not None:
      batch = prepare(batch, key)
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
