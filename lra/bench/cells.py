"""What a benchmark cell is: its spec, its config and its row.

A cell is one (model, length) of the Text table, or one --config cell
(lra/bench/main.py). Its spec is a small JSON-able dict (what a cell's own
process receives, lra/bench/isolate.py); `resolved` fills in the preset's
defaults where the cell runs (they depend on the backend), `spec_config`
makes the config the cell measures (lra/bench/measure.py), and a row of
ROW_FIELDS records it. `failure` and `environment` are also the layer
benchmark's (lra/bench/layer.py).
"""

import flax
import jax
import ml_collections

from lra.bench.report import CEILING
from lra.errors import UserError
from lra.train import cli
from lra.train import config as config_loader
from lra.train.oom import out_of_memory

PRESETS = {
  'paper': {'batch_size': 32, 'steps': 20, 'warmup': 3},
  'cpu': {
    'batch_size': 2,
    'steps': 5,
    'warmup': 1,
    'model.num_layers': 2,
    'model.emb_dim': 64,
    'model.qkv_dim': 64,
    'model.mlp_dim': 128,
    'model.num_heads': 2,
  },
  'tiny': {
    'batch_size': 2,
    'steps': 2,
    'warmup': 1,
    'model.num_layers': 1,
    'model.emb_dim': 16,
    'model.qkv_dim': 16,
    'model.mlp_dim': 32,
    'model.num_heads': 2,
  },
}


# One benchmark.json row per cell; None where a value is unknown. Of note:
# peak_memory_bytes = memory_analysis['peak'] (models/attention/memory.py);
# device_peak_* only on GPU/TPU; compile_seconds = trace + lower + compile;
# flops_per_step from XLA's cost analysis of the step (per device); mfu =
# flops_per_step x steps_per_sec / peak_flops_per_sec; the loop_* fields
# only in --mode loop; cell_seconds: the cell's wall time, start-up
# included; isolation 'process' (--cell_timeout_s > 0) or 'in_process'.
ROW_FIELDS = (
  'model',
  'task',
  'config',
  'length',
  'sequence_length',
  'batch_size',
  'preset',
  'mode',
  'status',
  'error',
  'steps_per_sec',
  'steps_per_sec_min',
  'steps_per_sec_max',
  'examples_per_sec',
  'tokens_per_sec',
  'tokens_per_example',
  'timed_steps',
  'warmup_steps',
  'compile_seconds',
  'peak_memory_bytes',
  'peak_memory_source',
  'memory_analysis',
  'device_peak_bytes_in_use',
  'device_peak_source',
  'num_params',
  'flops_per_step',
  'peak_flops_per_sec',
  'peak_flops_source',
  'mfu',
  'loop_steps_per_sec',
  'loop_timed_steps',
  'bare_steps_per_sec',
  'loop_over_bare',
  'fused_attention_kernel',
  'cell_seconds',
  'cell_timeout_s',
  'isolation',
  'backend',
  'device_kind',
  'device_count',
  'jax_version',
  'flax_version',
  'model_config',
)


def text_config(model_name):
  """The Text task's reference config for `model_name` (configs/text.py)."""
  return config_loader.task_config('text', model_name)


def ceiling_config():
  """The transformer's Text config with no token mixing (attention 'none')."""
  c = text_config('transformer')
  c.model_name = CEILING
  c.model.attention = ml_collections.ConfigDict({'name': 'none'})
  c.model.attention_dropout_rate = 0.0  # it has no attention weights
  return c


def cell_config(model_name, length, preset, batch_size, dtype='float32'):
  c = ceiling_config() if model_name == CEILING else text_config(model_name)
  c.update_from_flattened_dict(
    {k: v for k, v in PRESETS[preset].items() if '.' in k}
  )
  c.batch_size = batch_size
  c.max_length = length
  c.dtype = dtype
  return c


def default_preset():
  """The preset of a run that names none: cpu on CPU, paper elsewhere."""
  return 'cpu' if jax.default_backend() == 'cpu' else 'paper'


def resolved(spec):
  """The cell spec with its defaults filled in (needs the backend, so it
  runs in the cell's process): the preset and its batch, steps, warm-up."""
  spec = dict(spec)
  preset = spec.get('preset') or default_preset()
  if not spec.get('config_argv'):
    spec['preset'] = preset
  for name in ('batch_size', 'steps', 'warmup'):
    if spec.get(name) is None and not (
      name == 'batch_size' and spec.get('config_argv')
    ):
      spec[name] = PRESETS[preset][name]
  return spec


def spec_config(spec):
  """The config of a resolved cell spec (a Text cell, or --config's)."""
  if not spec.get('config_argv'):
    return cell_config(
      spec['model'],
      spec['length'],
      spec['preset'],
      spec['batch_size'],
      spec.get('dtype') or 'float32',
    )
  config = cli.config_from_argv(['benchmark.py', *spec['config_argv']])
  for key, name in (
    ('max_length', 'length'),
    ('batch_size', 'batch_size'),
    ('dtype', 'dtype'),
  ):
    if spec.get(name) is not None:
      setattr(config, key, spec[name])
  config_loader.check(config)
  return config


def model_summary(config):
  m = config.model
  return {
    'num_layers': m.num_layers,
    'emb_dim': m.emb_dim,
    'qkv_dim': m.qkv_dim,
    'num_heads': m.num_heads,
    'mlp_dim': m.mlp_dim,
    'pooling': m.pooling,
    'dropout_rate': m.dropout_rate,
    'attention_dropout_rate': m.attention_dropout_rate,
    'attention': m.attention.to_dict(),
    'dtype': config.dtype,
  }


def base_row(spec):
  """A row holding what the spec says of its cell (before it runs)."""
  row = dict.fromkeys(ROW_FIELDS)
  row.update(
    model=spec['model'],
    length=spec.get('length'),
    batch_size=spec.get('batch_size'),
    preset=spec.get('preset'),
    mode=spec.get('mode', 'latency'),
    timed_steps=spec.get('steps'),
    warmup_steps=spec.get('warmup'),
    config=' '.join(spec['config_argv']) if spec.get('config_argv') else None,
  )
  return row


def failure(error):
  """(status, message) of an exception raised by a cell: 'OOM' when
  lra.train.oom says memory ran out, else 'error'; the message's first
  line (a UserError's sentence as it is, others after their type name)."""
  message = f'{type(error).__name__}: {error}'.strip()
  if isinstance(error, UserError):
    message = str(error)
  status = 'OOM' if out_of_memory(error) else 'error'
  return status, message.splitlines()[0][:500]


def environment():
  """The machine and versions a row was measured with."""
  device = jax.devices()[0]
  return {
    'backend': jax.default_backend(),
    'device_kind': device.device_kind,
    'device_count': jax.device_count(),
    'jax_version': jax.__version__,
    'flax_version': flax.__version__,
  }
