"""Checks a run's config and paths before anything is built or written.

`check_config(config)` checks every numeric field's range and the choices
that would otherwise fail deep inside a run (a ZeroDivisionError at step 1,
an orbax error at the end, a shape error in the model); `check_dir(path,
flag)` checks that a directory can be created and written. Each failure is a
UserError of one sentence naming the flag and a valid value, e.g.

  --config.batch_size=0 is out of range: it must be an integer >= 1, e.g.
  --config.batch_size=32.

train.py runs both before it creates the workdir, so a refused run leaves
nothing behind.
"""

import math

from lra import data as tasks
from lra.data.dirs import check_dir  # noqa: F401 (validate.check_dir)
from lra.errors import UserError
from lra.train import objectives, wandb_log

SCHEDULES = ('rsqrt', 'cosine', 'constant')

# field -> (kind, lowest, example): kind 'int' or 'float'; lowest is the
# smallest valid value (an exclusive bound for floats marked '>').
_INT_AT_LEAST = {
  'batch_size': (1, 32),
  'eval_batch_size': (0, 0),
  'num_train_steps': (1, 5000),
  'eval_every_steps': (1, 500),
  'checkpoint_every_steps': (1, 500),
  'prefetch': (-1, 2),
  'log_every_steps': (1, 50),
  'keep_checkpoints': (1, 2),
  'warmup_steps': (0, 1000),
  'grad_accum_steps': (1, 1),
  'seed': (0, 0),
  'model.num_layers': (1, 4),
  'model.emb_dim': (1, 512),
  'model.qkv_dim': (1, 512),
  'model.num_heads': (1, 8),
  'model.mlp_dim': (1, 1024),
}
# field -> (low, high, low_closed, high_closed, example)
_FLOAT_RANGE = {
  'learning_rate': (0.0, math.inf, False, False, 0.001),
  'weight_decay': (0.0, math.inf, True, False, 0.1),
  'ssm_learning_rate': (0.0, math.inf, True, False, 0.001),
  'ssm_weight_decay': (0.0, math.inf, True, False, 0.0),
  'adam_b1': (0.0, 1.0, True, False, 0.9),
  'adam_b2': (0.0, 1.0, True, False, 0.98),
  'adam_eps': (0.0, math.inf, True, False, 1e-9),
  'grad_clip_norm': (0.0, math.inf, True, False, 1.0),
  'checkpoint_every_minutes': (0.0, math.inf, True, False, 30),
  'model.dropout_rate': (0.0, 1.0, True, False, 0.1),
  'model.attention_dropout_rate': (0.0, 1.0, True, False, 0.1),
}


def _get(config, dotted):
  for part in dotted.split('.'):
    config = config[part]
  return config


def _flag(key, value):
  return f'--config.{key}={value}'


def _check_int(config, key, lowest, example):
  value = _get(config, key)
  if isinstance(value, bool) or not isinstance(value, int) or value < lowest:
    raise UserError(
      f'{_flag(key, value)} is out of range: it must be an integer >= '
      f'{lowest}, e.g. {_flag(key, example)}.'
    )


def _check_float(config, key, low, high, low_closed, high_closed, example):
  value = _get(config, key)
  ok = isinstance(value, (int, float)) and not isinstance(value, bool)
  if ok:
    ok = math.isfinite(value) and (value >= low if low_closed else value > low)
    ok = ok and (value <= high if high_closed else value < high)
  if not ok:
    left = '[' if low_closed else '('
    right = ']' if high_closed else ')'
    top = 'inf' if high == math.inf else f'{high:g}'
    raise UserError(
      f'{_flag(key, value)} is out of range: it must be a finite number in '
      f'{left}{low:g}, {top}{right}, e.g. {_flag(key, example)}.'
    )


def _check_choice(config, key, choices):
  value = _get(config, key)
  if value not in choices:
    raise UserError(
      f'{_flag(key, value)} is not one of {", ".join(choices)}; e.g. '
      f'{_flag(key, choices[0])}.'
    )


def pixel_length(task, options):
  """The pixels per image of a pixel task (the cache width: max_length may
  cut an image, never pad it with made-up black pixels), or None for token
  tasks (whose inputs are cut or padded to any length >= 1)."""
  if task.name == 'image':
    return 32 * 32
  if task.name in ('pathfinder', 'pathx'):
    o = task.options(options)
    try:
      return (int(o.get('resolution', 32)) // int(o.get('downsample', 1))) ** 2
    except (TypeError, ValueError):
      return None  # the task's own option check names it
  return None


def _leaves(config, prefix=''):
  """(dotted key, value) of every field of a ConfigDict, lists' items
  included (a per-layer option)."""
  for key, value in config.items():
    dotted = f'{prefix}{key}'
    if hasattr(value, 'items'):
      yield from _leaves(value, f'{dotted}.')
    elif isinstance(value, (list, tuple)):
      for item in value:
        yield dotted, item
    else:
      yield dotted, value


def check_finite(config):
  """UserError naming the first float field that is nan or inf: no field
  takes one (a rate of inf trains nothing, a nan initialises nan weights
  and would be reported as a diverged learning rate)."""
  for key, value in _leaves(config):
    if isinstance(value, float) and not math.isfinite(value):
      raise UserError(
        f'{_flag(key, value)} is not a finite number; give a finite value '
        '(no field of the config takes nan or inf).'
      )


def check_config(config):
  """Raises UserError (one sentence) for the first invalid field."""
  check_finite(config)
  task = tasks.get_task(config.task)
  options = config.data.to_dict()
  task.cache_dir('', options)  # the task's own data-option checks
  for key, (lowest, example) in _INT_AT_LEAST.items():
    _check_int(config, key, lowest, example)
  for key, spec in _FLOAT_RANGE.items():
    _check_float(config, key, *spec)
  _check_choice(config, 'schedule', SCHEDULES)
  objectives.check(config)
  wandb_log.check(config)  # wandb_mode; wandb_project needs the package

  need = pixel_length(task, options)
  length = config.max_length
  if isinstance(length, bool) or not isinstance(length, int) or length < 1:
    raise UserError(
      f'{_flag("max_length", length)} is out of range: it must be an '
      f'integer >= 1, e.g. {_flag("max_length", need or 1000)}.'
    )
  if need is not None and length > need:
    raise UserError(
      f'{_flag("max_length", length)} is longer than the {need} pixels of a '
      f'{task.name} image (one token per pixel); use '
      f'{_flag("max_length", need)}.'
    )

  m = config.model
  if m.qkv_dim % m.num_heads:
    divisors = [d for d in range(1, m.qkv_dim + 1) if m.qkv_dim % d == 0]
    near = min(divisors, key=lambda d: (abs(d - m.num_heads), d))
    raise UserError(
      f'{_flag("model.num_heads", m.num_heads)} does not divide '
      f'model.qkv_dim={m.qkv_dim}; use a divisor of it, e.g. '
      f'{_flag("model.num_heads", near)}.'
    )

  import jax  # pylint: disable=g-import-not-at-top (prepare needs no jax)

  n = jax.device_count()
  for key in ('batch_size', 'eval_batch_size'):
    size = config[key]
    if size % n:
      raise UserError(
        f'{key} {size} is not divisible by the {n} devices; use a multiple '
        f'of {n}, e.g. {_flag(key, max(n, size // n * n))}.'
      )
