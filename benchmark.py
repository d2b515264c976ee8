r"""The LRA speed/memory table (Table 2), measured side by side in one process.

  python benchmark.py --out runs/bench          # every model, 1K-4K
  python benchmark.py --preset paper --models performer,local --out DIR
  python benchmark.py --models all,-transformer_fused --lengths 1024 --out DIR
  python benchmark.py --preset paper --dtype bfloat16 --models \
    transformer,transformer_fused --out DIR   # GPU: cuDNN flash attention

Each cell (model, length) times full training steps (forward, backward and
AdamW update, lra.steps.make_train_step) of the byte-level Text classifier
(configs/text.py, max_length = length) on random bytes, so no data set is
needed. Speed is the median of the timed steps after compilation and
warm-up. Memory is the compiled train step's from XLA's memory analysis
(temp + arguments + outputs - donated aliases, per device), which is
comparable across backends; on GPU/TPU the device's own peak is recorded too.

--models: 'all' (every key of configs.models.MODELS, the default) or a list,
measured exactly as listed. --baselines adds the exact baselines
'transformer' (einsum softmax, as LRA measured) and 'transformer_fused'
(jax.nn.dot_product_attention) in front; it is on by default only when
--models is not given ('-name' drops one). The tables' (x) ratios are to
'transformer' when it was measured; without it they are left out, and the
table says so.

--ceiling adds a row named 'ceiling', measured first in the same run: the
transformer's Text config with model.attention = {'name': 'none'} (out = v,
no token mixing; models/attention/none.py), the fastest and smallest any
attention could be at that width. The table then also gives every model's
speed and memory as a fraction of it. The ceiling is not a model name of
configs/models.py: it is never trained, and eval.py --table never shows it.

Presets (explicit --batch_size/--steps/--warmup override them):
  paper: the Text reference model (4 layers, emb 256, qkv 256, mlp 1024,
    4 heads), batch 32, 20 timed steps after 3 warm-up steps. All 32 sit
    on this machine's devices, where the paper split them over 16 TPU v3
    chips (about 2 per chip) and gave memory per device: only ratios to the
    transformer compare; --batch_size 2 is the per-chip comparison.
  cpu (the default on CPU): 2 layers, emb 64, qkv 64, mlp 128, 2 heads,
    batch 2, 5 timed steps after 1 warm-up; 1K-4K in minutes on 2 cores.
  tiny: 1 layer, emb 16, batch 2, 2 + 1 steps; for tests.

--dtype bfloat16 computes every cell in bfloat16 (params stay float32). Each
row's fused_attention_kernel is 'cudnn' when the compiled step calls cuDNN's
fused attention (transformer_fused on an NVIDIA GPU in bfloat16), and the
table names those models.

Writes to --out: benchmark.json (one row per cell, updated after each),
benchmark.md (Table 2 layout, the paper's numbers beside ours), speed.png
and memory.png. A cell that runs out of memory reads "OOM", one that fails
"error" (its message is in the JSON and under the table); the rest go on.
"""

import gc
import importlib
import importlib.util
import os
import sys
import time

from absl import app, flags, logging
import flax
from flax import nnx
import jax
import ml_collections
import numpy as np

from configs import base as base_config
from configs import models as model_configs
from lra import runtime, steps, tasks, validate
from lra.bench_report import CEILING, write_report
from lra.errors import UserError
from lra.metrics import write_json
from models.attention.memory import compiled_memory
import models.attention.none  # noqa: F401 (registers 'none' for --ceiling)
from models.classifier import build_model

BASELINES = ('transformer', 'transformer_fused')
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
MEMORY_SOURCE = 'xla_compiled_memory_analysis'
# One benchmark.json row per cell; None where a value is unknown. Of note:
# peak_memory_bytes = memory_analysis['peak'] (models/attention/memory.py);
# device_peak_* only on GPU/TPU; compile_seconds = trace + lower + compile;
# flops_per_step from XLA's cost analysis of the step (per device).
ROW_FIELDS = (
  'model',
  'length',
  'sequence_length',
  'batch_size',
  'preset',
  'status',
  'error',
  'steps_per_sec',
  'steps_per_sec_min',
  'steps_per_sec_max',
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
  'fused_attention_kernel',
  'backend',
  'device_kind',
  'device_count',
  'jax_version',
  'flax_version',
  'model_config',
)


# --------------------------------------------------------------- config
def text_config(model_name):
  """The Text task's reference config for `model_name`."""
  if importlib.util.find_spec('configs.text') is not None:
    return importlib.import_module('configs.text').get_config(model_name)
  # Until configs/text.py exists: its reference values (byte-level IMDB).
  c = base_config.get_base_config()
  c.task = 'text'
  c.max_length = 1000
  c.batch_size = 32
  c.model.num_layers = 4
  c.model.emb_dim = 256
  c.model.qkv_dim = 256
  c.model.num_heads = 4
  c.model.mlp_dim = 1024
  model_configs.apply_model(c, model_name)
  return base_config.finalize(c, [])


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


def fused_kernel_of(compiled):
  """'cudnn' when the compiled step calls cuDNN's fused attention (what
  jax.nn.dot_product_attention picks on NVIDIA GPUs for bf16/fp16), else
  None: on CPU, or for f32, XLA writes the attention out as plain ops."""
  try:
    text = compiled.as_text()
  except Exception:  # pylint: disable=broad-except
    return None
  return 'cudnn' if '__cudnn$fmha' in text else None


def select_models(spec, baselines=False):
  """'all' or 'a,b,-c' -> model names: every known model for 'all', else
  the listed ones, after the BASELINES when `baselines`; '-name' drops."""
  known = model_configs.known_models()
  items = [s.strip() for s in spec.split(',') if s.strip()]
  drop = {s[1:] for s in items if s.startswith('-')}
  keep = [s for s in items if not s.startswith('-')]
  names = list(BASELINES) if baselines else []
  names += list(known) if 'all' in keep else keep
  bad = [n for n in drop | set(names) if n not in known]
  if bad:
    raise UserError(
      f'Unknown model {bad[0]!r} in --models; known: {", ".join(known)}.'
    )
  names = [n for n in dict.fromkeys(names) if n not in drop]
  if not names:
    raise UserError(
      f'--models {spec!r} leaves no model to measure; name at least one, '
      'e.g. --models transformer.'
    )
  return names


def parse_lengths(spec):
  """'1024,2048' -> [1024, 2048]; each length a positive integer."""
  try:
    lengths = [int(s) for s in spec.split(',') if s.strip()]
  except ValueError:
    lengths = None
  if not lengths or min(lengths) < 1:
    raise UserError(
      f'--lengths {spec!r} is not a list of positive integers; '
      'write e.g. --lengths 1024,2048.'
    )
  return lengths


def check_counts(batch_size, num_steps, warmup):
  for flag, value, lowest in (
    ('--batch_size', batch_size, 1),
    ('--steps', num_steps, 1),
    ('--warmup', warmup, 0),
  ):
    if value < lowest:
      raise UserError(
        f'{flag}={value} is out of range: it must be an integer >= '
        f'{lowest}, e.g. {flag}={max(lowest, 2)}.'
      )


# -------------------------------------------------------------- measure
def random_batch(config, task, seed=0):
  rng = np.random.default_rng(seed)
  b, length = config.batch_size, config.max_length
  return {
    'inputs': rng.integers(1, task.vocab_size, (b, length), dtype=np.int32),
    'labels': rng.integers(0, task.num_classes, (b,), dtype=np.int32),
    'weights': np.ones((b,), np.float32),
  }


def flops_of(compiled):
  """'flops' of compiled.cost_analysis() (a dict, a list of them, or None)."""
  try:
    cost = compiled.cost_analysis()
  except Exception:  # pylint: disable=broad-except
    return None
  if isinstance(cost, (list, tuple)):
    cost = cost[0] if cost else None
  flops = (cost or {}).get('flops')
  return None if flops is None or flops < 0 else float(flops)


def device_stats():
  return jax.local_devices()[0].memory_stats() or {}


def memory_limit():
  """Bytes a cell may use: the device's limit, or the host's available."""
  if 'bytes_limit' in device_stats():
    return device_stats()['bytes_limit']
  try:
    with open('/proc/meminfo') as f:
      info = dict(line.split(':', 1) for line in f)
    return int(info['MemAvailable'].split()[0]) * 1024
  except (OSError, KeyError, ValueError):
    return None


class OutOfMemory(Exception):
  pass


def measure(row, config, task, shardings, num_steps, warmup):
  """Fills `row` for one cell; raises on failure (row keeps what it got)."""
  replicated, batch_sharding = shardings
  model = build_model(config, task)
  row['num_params'] = int(
    sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
  )
  tx = steps.make_optimizer(config)
  optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
  graphdef, state = nnx.split((model, optimizer))
  del model, optimizer
  state = jax.device_put(state, replicated)
  batch = runtime.to_device(random_batch(config, task), batch_sharding)
  keys = list(jax.random.split(jax.random.key(config.seed), warmup + num_steps))

  start = time.perf_counter()
  train_step = steps.make_train_step(graphdef)
  compiled = train_step.lower(state, batch, keys[0]).compile()
  row['compile_seconds'] = time.perf_counter() - start
  memory = compiled_memory(compiled)
  row.update(
    memory_analysis=memory,
    peak_memory_bytes=memory['peak'],
    peak_memory_source=MEMORY_SOURCE,
    flops_per_step=flops_of(compiled),
    fused_attention_kernel=fused_kernel_of(compiled),
  )
  limit = memory_limit()
  if limit and memory['peak'] > 0.95 * limit:
    raise OutOfMemory(
      f'needs {memory["peak"] / 1e9:.2f} GB by XLA memory analysis, '
      f'{limit / 1e9:.2f} GB available'
    )

  peak_before = device_stats().get('peak_bytes_in_use')
  seconds = []
  for key in keys:
    start = time.perf_counter()
    state, metrics = compiled(state, batch, key)
    jax.block_until_ready((state, metrics))
    seconds.append(time.perf_counter() - start)
  timed = np.array(seconds[warmup:])
  row.update(
    steps_per_sec=float(1.0 / np.median(timed)),
    steps_per_sec_min=float(1.0 / timed.max()),
    steps_per_sec_max=float(1.0 / timed.min()),
  )
  peak_after = device_stats().get('peak_bytes_in_use')
  if peak_after is not None:
    # The device counter is a process-wide high-water mark.
    own = peak_before is None or peak_after > peak_before
    row['device_peak_bytes_in_use'] = int(peak_after)
    row['device_peak_source'] = (
      'device.memory_stats()["peak_bytes_in_use"], process high-water mark '
      + ('set by this cell' if own else 'set earlier: an upper bound')
    )
  del state, batch, compiled, metrics


def failure(error):
  """(status, message) for an exception raised by a cell."""
  message = f'{type(error).__name__}: {error}'.strip()
  text = message.lower()
  oom = isinstance(error, (OutOfMemory, MemoryError)) or any(
    s in text for s in ('resource_exhausted', 'out of memory')
  )
  return ('OOM' if oom else 'error'), message.splitlines()[0][:500]


def environment():
  device = jax.devices()[0]
  return {
    'backend': jax.default_backend(),
    'device_kind': device.device_kind,
    'device_count': jax.device_count(),
    'jax_version': jax.__version__,
    'flax_version': flax.__version__,
  }


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


# ------------------------------------------------------------------ run
def run_benchmark(
  model_names,
  lengths,
  out,
  *,
  preset,
  batch_size,
  num_steps,
  warmup,
  ceiling=False,
  dtype='float32',
):
  """Measures every (model, length) cell; writes and returns the rows.

  ceiling: also measure the 'ceiling' row (attention 'none'), first.
  dtype: the compute dtype of every cell ('float32' or 'bfloat16').
  """
  os.makedirs(out, exist_ok=True)
  if ceiling:
    model_names = [CEILING] + [m for m in model_names if m != CEILING]
  runtime.check_batch(batch_size)
  task = tasks.get_task('text')
  shardings = runtime.make_mesh()
  env = environment()
  rows, cells = [], [(m, n) for m in model_names for n in lengths]
  # Other work on a shared CPU slows every cell; the table says how busy.
  load = os.getloadavg()[0] if hasattr(os, 'getloadavg') else None
  start = time.perf_counter()
  for i, (name, length) in enumerate(cells):
    row = dict.fromkeys(ROW_FIELDS)
    row.update(
      env,
      model=name,
      length=length,
      batch_size=batch_size,
      preset=preset,
      timed_steps=num_steps,
      warmup_steps=warmup,
    )
    try:
      config = cell_config(name, length, preset, batch_size, dtype)
      row['model_config'] = model_summary(config)
      row['sequence_length'] = length + int(config.model.pooling == 'cls')
      measure(row, config, task, shardings, num_steps, warmup)
      row['status'] = 'ok'
    except Exception as e:  # pylint: disable=broad-except
      row['status'], row['error'] = failure(e)
    rows.append(row)
    write_json(os.path.join(out, 'benchmark.json'), rows)
    print(progress_line(i + 1, len(cells), row), flush=True)
    gc.collect()
  seconds = time.perf_counter() - start
  write_report(rows, out, seconds=seconds, load=load)
  print(f'{len(cells)} cells in {seconds:.0f} s; wrote {out}/benchmark.md')
  return rows


def progress_line(i, n, row):
  head = f'[{i}/{n}] {row["model"]} L={row["length"]}:'
  if row['status'] != 'ok':
    return f'{head} {row["status"]} ({row["error"]})'
  return (
    f'{head} {row["steps_per_sec"]:.3g} steps/s, '
    f'{row["peak_memory_bytes"] / 1e6:.0f} MB, '
    f'compile {row["compile_seconds"]:.1f} s'
    + (', cuDNN fused attention' if row.get('fused_attention_kernel') else '')
  )


# ---------------------------------------------------------------- flags
def define_flags():
  """Flags of the command line (defined here so importing defines none)."""
  flags.DEFINE_string(
    'models', 'all', "'all' or a,b,... (exactly these); '-name' drops one."
  )
  flags.DEFINE_boolean(
    'baselines',
    None,
    'Add the exact baselines (transformer, transformer_fused) to --models '
    '(default: on only when --models is not given).',
  )
  flags.DEFINE_string(
    'lengths', '1024,2048,3072,4096', 'Sequence lengths, comma-separated.'
  )
  flags.DEFINE_enum(
    'preset', None, list(PRESETS), 'Model size and batch (default: cpu on CPU).'
  )
  flags.DEFINE_integer('batch_size', None, 'Global batch size.')
  flags.DEFINE_integer('steps', None, 'Timed steps per cell.')
  flags.DEFINE_integer('warmup', None, 'Untimed steps after compile.')
  flags.DEFINE_string('out', None, 'Output directory.')
  flags.DEFINE_enum(
    'dtype',
    'float32',
    ['float32', 'bfloat16'],
    'Compute dtype of activations (config.dtype; params stay float32). On '
    'NVIDIA GPUs bfloat16 lets transformer_fused use cuDNN flash attention.',
  )
  flags.DEFINE_boolean(
    'ceiling',
    False,
    "Also measure the no-attention ceiling (row 'ceiling') and give each "
    "model's speed and memory as a fraction of it.",
  )


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {" ".join(argv[1:])}')
  f = flags.FLAGS
  if not f['verbosity'].present:
    logging.set_verbosity(logging.WARNING)
  try:
    if not f.out:
      raise UserError('Give --out DIR, the directory for the table and plots.')
    preset = f.preset or ('cpu' if jax.default_backend() == 'cpu' else 'paper')

    def pick(name):
      return PRESETS[preset][name] if f[name].value is None else f[name].value

    lengths = parse_lengths(f.lengths)
    baselines = f.baselines
    if baselines is None:
      baselines = not f['models'].present
    model_names = select_models(f.models, baselines)
    check_counts(pick('batch_size'), pick('steps'), pick('warmup'))
    validate.check_dir(f.out, '--out')
    run_benchmark(
      model_names,
      lengths,
      f.out,
      preset=preset,
      batch_size=pick('batch_size'),
      num_steps=pick('steps'),
      warmup=pick('warmup'),
      ceiling=f.ceiling,
      dtype=f.dtype,
    )
  except UserError as e:
    print(f'error: {e}', file=sys.stderr)
    sys.exit(2)


if __name__ == '__main__':
  define_flags()
  app.run(main)
