r"""The LRA speed/memory table (Table 2), and any config's training step.

  python benchmark.py --out runs/bench          # every model, 1K-4K
  python benchmark.py --preset paper --models performer,local --out DIR
  python benchmark.py --models all,-transformer_fused --lengths 1024 --out DIR
  python benchmark.py --preset paper --dtype bfloat16 --models \
    transformer,transformer_fused --out DIR   # GPU: cuDNN flash attention
  python benchmark.py --config configs/listops.py:transformer,small \
    --mode throughput --out DIR   # any task's config, --config.* overrides
  python benchmark.py --config configs/listops.py:transformer,smoke \
    --mode loop --out DIR   # train.py's loop against the bare step
  python benchmark.py --layer --models transformer,local,mamba \
    --lengths 1024,2048,4096 --out DIR   # one attention layer alone

Each cell (model, length) times full training steps (forward, backward and
AdamW update, lra.train.steps.make_train_step) of the byte-level Text classifier
(configs/text.py, max_length = length) on random bytes, so no data set is
needed. Speed is the median of the timed steps after compilation and
warm-up. Memory is the compiled train step's from XLA's memory analysis
(temp + arguments + outputs - donated aliases, per device), which is
comparable across backends; on GPU/TPU the device's own peak is recorded too.

--config configs/<task>.py:<model>[,preset] (parsed as train.py parses it,
with any --config.<key>=<value> overrides) makes the cell that config's
training step at its own batch size and length, on random inputs of the
shapes train.py's batches have (loop.training_batch on random data: two
documents for retrieval, a label per position for mqar, an LM objective's
masked inputs). --models a,b then runs the same config file, presets and
overrides for each model; --lengths (when given) sets max_length per cell,
--batch_size and --dtype override the config's.

--layer times ONE attention layer instead of a training step
(lra/bench/layer.py): an attention core alone on q, k, v [B, L, H, D]
or a sequence mixer alone on x [B, L, E], each model's options from
configs/models.py, forward and forward + backward (grad of the sum of the
output w.r.t. the inputs and parameters), every model of a length in
alternating rounds in this one process; median ms with min and max, XLA's
compiled temp memory of both programs, ratios to 'transformer'. Sizes:
--layer_batch (2), --layer_heads (4), --layer_head_dim (64),
--layer_rounds (10), --warmup (1); --models, --lengths, --dtype, --baselines
as below. Writes layer.json and layer.md to --out.

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
A --config cell takes its steps and warm-up from the default preset (cpu
on CPU, paper elsewhere) unless --steps/--warmup are given.

--mode:
  latency (the default): every step is waited for (block_until_ready) and
    timed on its own; steps/s is the median, with min and max.
  throughput: the timed steps are dispatched back to back and waited for
    once at the end: steps/s = steps / that time (what training sees when
    the host runs ahead of the device).
  loop (needs --config): the real training loop (train.py's
    train_and_evaluate on the config's data: two stretches of
    log_every_steps to warm up, then the timed steps; evaluation and
    checkpoints only after the last step, which its steps/s timer leaves
    out) against the bare compiled step's throughput on the same shapes in
    the same process: loop_steps_per_sec, bare_steps_per_sec and
    loop_over_bare. The loop's rate is from metrics.jsonl's train rows
    after the two warm-up stretches (loop_rate). --loop_rounds (3) pairs
    of (bare, loop) run one after the other; the row gives the medians
    (loop_over_bare: the median of the rounds' ratios) and each round in
    loop_rounds, since a shared CPU's speed drifts more between runs than
    the gap measured.

Every cell also gets examples_per_sec (steps/s x batch), tokens_per_sec
(x max_length x documents per example; CLS not counted) and mfu, model
FLOP utilisation = flops_per_step (XLA's cost analysis of the compiled step,
per device) x steps/s / the device's peak dense FLOP/s for the cell's dtype
(PEAK_FLOPS below, or --peak_flops). mfu is null where the peak is unknown
(CPU) and does not count FLOPs inside custom calls (cuDNN fused attention).

--cell_timeout_s (default 300): each cell runs in its own process (this
script with --cell_spec), killed when it runs past the deadline and
recorded with status 'timeout' (with what it wrote before: compile time,
memory, FLOPs); the run goes on with the next cell. A hang in XLA's
compiler or a device call cannot be interrupted from inside a process,
which is why a cell is a process. Each cell pays the start-up (imports and
device initialisation, seconds), and device memory is freed between cells,
so device_peak_bytes_in_use is the cell's own. --cell_timeout_s=0 runs
every cell in this process without a deadline.

--dtype bfloat16 computes every cell in bfloat16 (params stay float32). Each
row's fused_attention_kernel is 'cudnn' when the compiled step calls cuDNN's
fused attention (transformer_fused on an NVIDIA GPU in bfloat16), and the
table names those models.

Writes to --out: benchmark.json (one row per cell, rewritten after each
cell, so a killed run keeps what it measured), benchmark.md (Table 2
layout, the paper's numbers beside ours; a throughput table), speed.png and
memory.png, and cells/ (each cell process's log and row). A cell that runs
out of memory reads "OOM", one that fails "error", one past its deadline
"timeout" (its message is in the JSON and under the table); the rest go on.
"""

import gc
import importlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

from absl import flags, logging
import flax
from flax import nnx
import jax
import ml_collections
from ml_collections import config_flags
import numpy as np

from configs import base as base_config
from configs import models as model_configs
from lra import data as tasks
from lra.bench import layer as layer_bench
from lra.bench.report import CEILING, write_report
from lra.errors import UserError
from lra.train import build, cli, loop, objectives, runtime, steps, validate
from lra.train.metrics import read_rows, write_json
from models.attention.memory import compiled_memory
import models.attention.none  # noqa: F401 (registers 'none' for --ceiling)

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
MODES = ('latency', 'throughput', 'loop')
DEFAULT_CELL_TIMEOUT_S = 300.0
MEMORY_SOURCE = 'xla_compiled_memory_analysis'

# Peak dense FLOP/s of one JAX device by device kind (the first entry whose
# key is in device.device_kind, lower case) and compute dtype, from the
# vendors' datasheets (no sparsity):
# - NVIDIA H200 and H100 SXM (H100 Tensor Core GPU datasheet, H200 product
#   brief): BF16/FP16 tensor 989 TFLOP/s, FP32 67 TFLOP/s (non-tensor).
# - NVIDIA H100 PCIe (H100 datasheet): BF16 756, FP32 51.
# - NVIDIA A100 (A100 Tensor Core GPU datasheet): BF16 312, FP32 19.5.
#   For float32 XLA may compute dots on the tensor cores in TF32 (H100/H200
#   495, A100 156 dense): mfu can then exceed 1 against the FP32 peak;
#   --peak_flops gives another peak.
# - Google TPUs (Cloud TPU system architecture pages), BF16 per chip: v4
#   275, v5e ('TPU v5 lite') 197, v5p 459, v6e ('TPU v6 lite') 918; v3 123
#   per chip = 61.5 per TensorCore, which JAX counts as a device. A float32
#   dot runs on the MXU in bfloat16 passes at JAX's default precision, so
#   float32 cells use the same peak.
# Anything else (CPU): unknown, mfu null unless --peak_flops is given.
PEAK_FLOPS = (
  ('h200', {'bfloat16': 989e12, 'float32': 67e12}, 'NVIDIA H200 datasheet'),
  (
    'h100 pcie',
    {'bfloat16': 756e12, 'float32': 51e12},
    'NVIDIA H100 datasheet',
  ),
  ('h100', {'bfloat16': 989e12, 'float32': 67e12}, 'NVIDIA H100 datasheet'),
  ('a100', {'bfloat16': 312e12, 'float32': 19.5e12}, 'NVIDIA A100 datasheet'),
  ('tpu v6 lite', {'bfloat16': 918e12}, 'Cloud TPU v6e system architecture'),
  ('tpu v5 lite', {'bfloat16': 197e12}, 'Cloud TPU v5e system architecture'),
  ('tpu v5', {'bfloat16': 459e12}, 'Cloud TPU v5p system architecture'),
  ('tpu v4', {'bfloat16': 275e12}, 'Cloud TPU v4 system architecture'),
  ('tpu v3', {'bfloat16': 61.5e12}, 'Cloud TPU v3 (per TensorCore)'),
)
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


def config_args(argv):
  """The --config flag and its --config.<key> overrides in argv, each one
  '--flag=value' argument: what a cell re-parses (cli.config_from_argv)."""
  rest, overrides = cli.split_overrides(argv)
  spec = []
  args = iter(rest)
  for arg in args:
    if arg in ('--config', '-config'):
      spec = [f'--config={next(args, "")}']
    elif arg.startswith(('--config=', '-config=')):
      spec = ['--config=' + arg.split('=', 1)[1]]
  return spec + overrides


def with_model(args, model):
  """config_args with the model of --config=<file>:<model>[,presets]
  replaced by `model` (the file, presets and overrides kept)."""
  out = []
  for arg in args:
    if arg.startswith('--config='):
      path, _, rest = arg[len('--config=') :].partition(':')
      presets = rest.split(',')[1:]
      arg = f'--config={path}:' + ','.join([model, *presets])
    out.append(arg)
  return out


def model_of(args):
  """The model named by --config=<file>:<model>[,presets] in args ('' when
  it names none: the config file's default)."""
  for arg in args:
    if arg.startswith('--config='):
      return arg.partition(':')[2].split(',')[0].strip()
  return ''


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
  validate.check_config(config)
  model_configs.check_attention(config)
  return config


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
  """Each count given (None: the preset's) in range, else UserError."""
  for flag, value, lowest in (
    ('--batch_size', batch_size, 1),
    ('--steps', num_steps, 1),
    ('--warmup', warmup, 0),
  ):
    if value is not None and value < lowest:
      raise UserError(
        f'{flag}={value} is out of range: it must be an integer >= '
        f'{lowest}, e.g. {flag}={max(lowest, 2)}.'
      )


# -------------------------------------------------------------- measure
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


def peak_flops(device_kind, dtype, override=None):
  """(peak dense FLOP/s of one device for `dtype`, its source) from
  PEAK_FLOPS, or (override, '--peak_flops'); (None, None) when unknown."""
  if override:
    return float(override), '--peak_flops'
  kind = (device_kind or '').lower()
  dtype = 'bfloat16' if dtype in ('bfloat16', 'float16') else 'float32'
  for key, peaks, source in PEAK_FLOPS:
    if key in kind:
      # TPUs: float32 dots run in bfloat16 passes at the default precision.
      return peaks.get(dtype, peaks['bfloat16']), f'{source}, {dtype}'
  return None, None


def add_rates(row, config, task, override=None):
  """examples/s, tokens/s and mfu from the row's steps_per_sec."""
  rate = row['steps_per_sec']
  row['tokens_per_example'] = config.max_length * task.num_inputs
  row['examples_per_sec'] = rate * config.batch_size
  row['tokens_per_sec'] = row['examples_per_sec'] * row['tokens_per_example']
  peak, source = peak_flops(row['device_kind'], config.dtype, override)
  row['peak_flops_per_sec'], row['peak_flops_source'] = peak, source
  flops = row['flops_per_step']
  row['mfu'] = flops * rate / peak if flops and peak else None


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


def measure(row, config, task, shardings, num_steps, warmup, **kwargs):
  """Fills `row` for one cell; raises on failure (row keeps what it got).

  row['mode'] picks the timing: 'latency' waits for and times every step;
  'throughput' (and 'loop', whose bare step this is) waits once after the
  timed steps. kwargs: on_compiled(row), called once the step is compiled.
  """
  replicated, batch_sharding = shardings
  graphdef, state = build.create_state(config, task, replicated)
  model, _ = nnx.merge(graphdef, state)
  row['num_params'] = int(
    sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
  )
  del model
  batch = runtime.to_device(loop.random_batch(config, task), batch_sharding)

  start = time.perf_counter()
  # The step train.py's loop runs: its key drawn inside from (seed, step),
  # masked_lm's masks too (lra.train.objectives.in_step), one packed metrics
  # row.
  train_step = steps.make_train_step(
    graphdef,
    objectives.in_step(config, task),
    config.seed,
    packed_lr=(steps.learning_rate_schedule(config), config.grad_accum_steps),
  )
  compiled = train_step.lower(state, batch).compile()
  row['compile_seconds'] = time.perf_counter() - start
  memory = compiled_memory(compiled)
  row.update(
    memory_analysis=memory,
    peak_memory_bytes=memory['peak'],
    peak_memory_source=MEMORY_SOURCE,
    flops_per_step=flops_of(compiled),
    fused_attention_kernel=fused_kernel_of(compiled),
  )
  if kwargs.get('on_compiled'):
    kwargs['on_compiled'](row)
  limit = memory_limit()
  if limit and memory['peak'] > 0.95 * limit:
    raise OutOfMemory(
      f'needs {memory["peak"] / 1e9:.2f} GB by XLA memory analysis, '
      f'{limit / 1e9:.2f} GB available'
    )

  peak_before = device_stats().get('peak_bytes_in_use')
  if row.get('mode', 'latency') == 'latency':
    seconds = []
    for _ in range(warmup + num_steps):
      start = time.perf_counter()
      state, metrics = compiled(state, batch)
      jax.block_until_ready((state, metrics))
      seconds.append(time.perf_counter() - start)
    timed = np.array(seconds[warmup:])
    row.update(
      steps_per_sec=float(1.0 / np.median(timed)),
      steps_per_sec_min=float(1.0 / timed.max()),
      steps_per_sec_max=float(1.0 / timed.min()),
    )
  else:  # back to back, one wait at the end
    for _ in range(warmup):
      state, metrics = compiled(state, batch)
      jax.block_until_ready((state, metrics))
    start = time.perf_counter()
    for _ in range(num_steps):
      state, metrics = compiled(state, batch)
    jax.block_until_ready((state, metrics))
    row['steps_per_sec'] = num_steps / (time.perf_counter() - start)
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


# The training loop's first two stretches between train rows carry
# one-time costs: compiling the step (the timer leaves it out) and, in the
# second, what the first row's reading and writing did for the first time
# after the timer was read (lra/train/progress.py), so both are left out.
LOOP_WARMUP_STRETCHES = 2


def loop_config(config, num_steps):
  """`config` for the loop of --mode loop: LOOP_WARMUP_STRETCHES stretches
  of log_every_steps, then num_steps timed steps; evaluation and
  checkpoints after the last step only (outside the loop's timer), no
  length curriculum (the full length, as the bare step)."""
  c = config.copy_and_resolve_references()
  with c.unlocked():
    c.num_train_steps = LOOP_WARMUP_STRETCHES * c.log_every_steps + num_steps
    c.eval_every_steps = c.num_train_steps
    c.checkpoint_every_steps = c.num_train_steps
    c.length_schedule = ''
  return c


def loop_rate(rows, skip=LOOP_WARMUP_STRETCHES):
  """(steps, steps/s) of the training loop from metrics.jsonl rows: the
  stretches between train rows (the timer starts after step 1, whose
  compilation it leaves out), after the first `skip` of them when more
  follow; (0, None) when no step was timed."""
  stretches, last = [], 1
  for r in sorted(
    (r for r in rows if r['split'] == 'train'), key=lambda r: r['step']
  ):
    if r.get('steps_per_sec'):
      stretches.append((r['step'] - last, r['steps_per_sec']))
    last = r['step']
  if len(stretches) > skip:
    stretches = stretches[skip:]
  done = sum(n for n, _ in stretches)
  seconds = sum(n / rate for n, rate in stretches)
  return done, (done / seconds if seconds > 0 else None)


def measure_loop(
  row, config, task, shardings, num_steps, warmup, rounds=1, **kwargs
):
  """--mode loop: `rounds` times, the bare step's throughput (measure)
  then train.py's train_and_evaluate on the same config and its steps/s
  (loop_rate), side by side. A shared machine's speed drifts by more than
  the gap measured here (tens of percent between runs a minute apart on
  this project's CPU), so each round's ratio compares neighbours and the
  row gives the median ratio and the medians of both rates
  (loop_rounds: every round's numbers)."""
  measured = []
  for i in range(max(rounds, 1)):
    bare_row = row if i == 0 else {'mode': row['mode']}
    measure(bare_row, config, task, shardings, num_steps, warmup, **kwargs)
    gc.collect()
    with tempfile.TemporaryDirectory(prefix='bench_loop_') as tmp:
      workdir = os.path.join(tmp, 'run')
      loop.train_and_evaluate(
        loop_config(config, num_steps),
        workdir,
        loop.ConfigRules.of(model_configs),
      )
      done, rate = loop_rate(read_rows(os.path.join(workdir, 'metrics.jsonl')))
    bare = bare_row['steps_per_sec']
    measured.append(
      {
        'bare_steps_per_sec': bare,
        'loop_steps_per_sec': rate,
        'loop_over_bare': rate / bare if rate and bare else None,
      }
    )
    gc.collect()

  def median(key):
    values = [m[key] for m in measured if m[key] is not None]
    return float(np.median(values)) if values else None

  row['loop_rounds'] = measured
  row['loop_timed_steps'] = done
  row['steps_per_sec'] = row['bare_steps_per_sec'] = median(
    'bare_steps_per_sec'
  )
  row['loop_steps_per_sec'] = median('loop_steps_per_sec')
  row['loop_over_bare'] = median('loop_over_bare')


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


# ---------------------------------------------------------------- cells
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


_SHARDINGS = []


def run_cell(spec, on_compiled=None):
  """Measures one cell in this process; returns its row (status 'ok',
  'OOM' or 'error': a failure is recorded, never raised)."""
  start = time.perf_counter()
  row = base_row(spec)
  try:
    if not _SHARDINGS:
      _SHARDINGS.append(runtime.make_mesh())
    row.update(environment())
    spec = resolved(spec)
    row.update(timed_steps=spec['steps'], warmup_steps=spec['warmup'])
    config = spec_config(spec)
    runtime.check_batch(config.batch_size)
    task = tasks.get_task(config.task)
    row.update(
      model=config.model_name if spec.get('config_argv') else spec['model'],
      task=config.task,
      length=config.max_length,
      batch_size=config.batch_size,
      preset=config.preset if spec.get('config_argv') else spec['preset'],
      model_config=model_summary(config),
      sequence_length=config.max_length + int(config.model.pooling == 'cls'),
    )
    kwargs = {'on_compiled': on_compiled} if on_compiled else {}
    if row['mode'] == 'loop':
      kwargs['rounds'] = spec.get('loop_rounds') or 1
    run = measure_loop if row['mode'] == 'loop' else measure
    run(
      row, config, task, _SHARDINGS[0], spec['steps'], spec['warmup'], **kwargs
    )
    add_rates(row, config, task, spec.get('peak_flops'))
    row['status'] = 'ok'
  except Exception as e:  # pylint: disable=broad-except
    row['status'], row['error'] = failure(e)
  row['cell_seconds'] = time.perf_counter() - start
  return row


# The project's root (above lra/): a cell's process imports from there.
ROOT = os.path.dirname(
  os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)


def project_env():
  """os.environ with the project's root first on PYTHONPATH."""
  env = dict(os.environ)
  env['PYTHONPATH'] = os.pathsep.join(
    filter(None, [ROOT, env.get('PYTHONPATH')])
  )
  return env


def cell_command(spec, row_path):
  """The command of a cell's own process (this script with --cell_spec)."""
  return [
    sys.executable,
    '-m',
    'lra.bench.main',
    '--cell_spec=' + json.dumps(spec),
    '--cell_out=' + row_path,
  ]


def _stop(proc):
  """Kills the cell's process group (its own session) and waits for it."""
  try:
    os.killpg(proc.pid, signal.SIGKILL)
  except (ProcessLookupError, PermissionError):
    pass
  proc.wait()


def _last_line(path):
  try:
    with open(path, errors='replace') as f:
      lines = [ln.strip() for ln in f.read().splitlines() if ln.strip()]
  except OSError:
    return ''
  return lines[-1][:300] if lines else ''


def run_isolated(spec, out, index, timeout_s):
  """Runs one cell in its own process, killed past `timeout_s` seconds:
  its row (status 'timeout' then, with what the cell wrote before)."""
  cells = os.path.join(out, 'cells')
  os.makedirs(cells, exist_ok=True)
  row_path = os.path.join(cells, f'cell_{index:03d}.json')
  log_path = os.path.join(cells, f'cell_{index:03d}.log')
  if os.path.exists(row_path):
    os.remove(row_path)
  start = time.perf_counter()
  timed_out = False
  with open(log_path, 'w') as log:
    proc = subprocess.Popen(
      cell_command(spec, row_path),
      stdout=log,
      stderr=subprocess.STDOUT,
      start_new_session=True,
      env=project_env(),
    )
    try:
      proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
      timed_out = True
      _stop(proc)
    except (
      BaseException
    ):  # Ctrl-C, SIGINT from experiments.device.devicecheck: no orphan
      _stop(proc)
      raise
  seconds = time.perf_counter() - start
  row = base_row(spec)
  try:
    with open(row_path) as f:
      row.update(json.load(f))
  except (OSError, ValueError):
    pass
  if timed_out:
    compiled = row.get('compile_seconds')
    row['status'] = 'timeout'
    row['error'] = f'ran past --cell_timeout_s={timeout_s:g} and was killed' + (
      f' (compiled in {compiled:.0f} s)' if compiled is not None else ''
    )
  elif row.get('status') in (None, 'running'):
    row['status'] = 'error'
    row['error'] = (
      f'the cell process exited with status {proc.returncode} before its '
      f'row was complete: {_last_line(log_path)} (log: {log_path})'
    )
  row.update(
    cell_seconds=seconds, cell_timeout_s=timeout_s, isolation='process'
  )
  return row


def run_cells(specs, out, *, cell_timeout_s=None):
  """Runs every cell (each in its own process, killed past cell_timeout_s
  seconds; in this process when it is None or 0), rewrites
  out/benchmark.json after each, then writes the report; returns the rows."""
  os.makedirs(out, exist_ok=True)
  rows = []
  # Other work on a shared CPU slows every cell; the table says how busy.
  load = os.getloadavg()[0] if hasattr(os, 'getloadavg') else None
  start = time.perf_counter()
  for i, spec in enumerate(specs):
    if cell_timeout_s:
      row = run_isolated(spec, out, i, cell_timeout_s)
    else:
      row = run_cell(spec)
      row['isolation'] = 'in_process'
    rows.append(row)
    write_json(os.path.join(out, 'benchmark.json'), rows)
    print(progress_line(i + 1, len(specs), row), flush=True)
    gc.collect()
  seconds = time.perf_counter() - start
  write_report(rows, out, seconds=seconds, load=load)
  print(f'{len(specs)} cells in {seconds:.0f} s; wrote {out}/benchmark.md')
  return rows


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
  mode='latency',
  cell_timeout_s=None,
  peak_flops=None,
):
  """Measures every (model, length) Text cell; writes and returns the rows.

  ceiling: also measure the 'ceiling' row (attention 'none'), first.
  dtype: the compute dtype of every cell ('float32' or 'bfloat16').
  preset, batch_size, num_steps, warmup: None takes the default preset's
  (resolved in the cell). mode, cell_timeout_s: as --mode and
  --cell_timeout_s (None: every cell in this process, no deadline).
  """
  if ceiling:
    model_names = [CEILING] + [m for m in model_names if m != CEILING]
  if batch_size is not None and not cell_timeout_s:
    runtime.check_batch(batch_size)
  specs = [
    {
      'model': m,
      'length': n,
      'preset': preset,
      'batch_size': batch_size,
      'steps': num_steps,
      'warmup': warmup,
      'dtype': dtype,
      'mode': mode,
      'peak_flops': peak_flops,
    }
    for m in model_names
    for n in lengths
  ]
  return run_cells(specs, out, cell_timeout_s=cell_timeout_s)


def run_config_benchmark(
  args,
  out,
  *,
  models=None,
  lengths=None,
  batch_size=None,
  num_steps=None,
  warmup=None,
  dtype=None,
  mode='latency',
  cell_timeout_s=None,
  peak_flops=None,
  loop_rounds=1,
):
  """Measures the training step of the config that `args` give
  (['--config=configs/<task>.py:<model>[,preset]', '--config.<k>=<v>',
  ...]), once per model of `models` (default: the config's) and length of
  `lengths` (default: its max_length); writes and returns the rows. None
  keeps the config's batch size and dtype and the default preset's steps."""
  specs = [
    {
      'model': model or model_of(args),
      'config_argv': with_model(args, model) if model else list(args),
      'length': n,
      'batch_size': batch_size,
      'steps': num_steps,
      'warmup': warmup,
      'dtype': dtype,
      'mode': mode,
      'peak_flops': peak_flops,
      'loop_rounds': loop_rounds,
    }
    for model in (models or [None])
    for n in (lengths or [None])
  ]
  return run_cells(specs, out, cell_timeout_s=cell_timeout_s)


def progress_line(i, n, row):
  where = f' L={row["length"]}' if row.get('length') else ''
  head = f'[{i}/{n}] {row["model"]}{where} ({row.get("mode")}):'
  if row['status'] != 'ok':
    return f'{head} {row["status"]} ({row["error"]})'
  line = (
    f'{head} {row["steps_per_sec"]:.3g} steps/s, '
    f'{row["examples_per_sec"]:.3g} examples/s, '
    f'{row["peak_memory_bytes"] / 1e6:.0f} MB'
  )
  if row.get('compile_seconds') is not None:
    line += f', compile {row["compile_seconds"]:.1f} s'
  if row.get('mfu') is not None:
    line += f', MFU {row["mfu"]:.1%}'
  if row.get('loop_steps_per_sec'):
    line += (
      f'; loop {row["loop_steps_per_sec"]:.3g} steps/s = '
      f'{row["loop_over_bare"]:.2f} x the bare step'
    )
  if row.get('fused_attention_kernel'):
    line += ', cuDNN fused attention'
  return line


def run_child(spec_json, row_path):
  """--cell_spec: measures one cell here, writing its row to row_path when
  it starts, once compiled and when done (so a killed cell left its
  compile time and memory)."""
  spec = json.loads(spec_json)
  partial = dict(base_row(spec), status='running')
  write_json(row_path, partial)

  def on_compiled(row):
    write_json(row_path, dict(row, status='running'))

  write_json(row_path, run_cell(spec, on_compiled))


# ---------------------------------------------------------------- flags
def define_flags():
  """Flags of the command line (defined here so importing defines none)."""
  config_flags.DEFINE_config_file(
    'config',
    None,
    "configs/<task>.py:<model>[,<preset>]: benchmark that config's "
    'training step (with --config.<key>=<value> overrides) instead of the '
    'Text cells.',
    lock_config=True,
  )
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
  flags.DEFINE_integer(
    'loop_rounds',
    3,
    '--mode loop: bare step and loop measured side by side this many '
    'times; the row gives the median ratio (and every round).',
    lower_bound=1,
  )
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
  flags.DEFINE_enum(
    'mode',
    'latency',
    list(MODES),
    'latency: wait for and time each step; throughput: steps back to back, '
    "one wait at the end; loop: train.py's loop against the bare step "
    '(needs --config).',
  )
  flags.DEFINE_float(
    'cell_timeout_s',
    DEFAULT_CELL_TIMEOUT_S,
    'Deadline of one cell, which runs in its own process; past it the cell '
    'is recorded as timed out and the run goes on (0: every cell in this '
    'process, no deadline).',
  )
  flags.DEFINE_float(
    'peak_flops',
    None,
    "Peak FLOP/s of one device for the MFU (default: the device kind's "
    'from PEAK_FLOPS; unknown on CPU).',
  )
  flags.DEFINE_boolean(
    'layer',
    False,
    'Time one attention layer (core or mixer) alone, forward and forward + '
    'backward, instead of training steps (lra/bench/layer.py).',
  )
  layer_bench.define_flags()
  flags.DEFINE_string('cell_spec', None, 'Internal: run one cell (JSON).')
  flags.DEFINE_string('cell_out', None, 'Internal: where --cell_spec writes.')


def _check_config_flags(f):
  """The flags that do not go with --config (or need it)."""
  for name in ('preset', 'ceiling', 'baselines'):
    if f[name].present:
      raise UserError(
        f'--{name} is for the Text cells; with --config give the preset '
        'in it (configs/<task>.py:<model>,<preset>) and the models with '
        '--models.'
      )


def main(argv):
  if len(argv) > 1:
    print(
      f'error: unexpected argument {argv[1]!r}; flags are written '
      '--name=value (see --help).',
      file=sys.stderr,
    )
    sys.exit(2)
  f = flags.FLAGS
  if not f['verbosity'].present:
    logging.set_verbosity(logging.WARNING)
  if f.cell_spec:
    run_child(f.cell_spec, f.cell_out)
    return
  try:
    if not f.out:
      raise UserError('Give --out DIR, the directory for the table and plots.')
    layer_bench.check_flags(f)
    if f.layer:
      validate.check_dir(f.out, '--out')
      baselines = f.baselines
      if baselines is None:
        baselines = not f['models'].present
      layer_bench.main(
        f, select_models(f.models, baselines), parse_lengths(f.lengths)
      )
      return
    if f.cell_timeout_s < 0:
      raise UserError(
        f'--cell_timeout_s={f.cell_timeout_s:g} is negative; give seconds '
        '(0: no deadline, every cell in this process).'
      )
    if f.peak_flops is not None and f.peak_flops <= 0:
      raise UserError(
        f'--peak_flops={f.peak_flops:g} is not positive; give one '
        "device's peak FLOP/s, e.g. --peak_flops=989e12."
      )
    check_counts(f.batch_size, f.steps, f.warmup)
    validate.check_dir(f.out, '--out')
    isolated = f.cell_timeout_s or None
    common = dict(
      batch_size=f.batch_size,
      num_steps=f.steps,
      warmup=f.warmup,
      mode=f.mode,
      cell_timeout_s=isolated,
      peak_flops=f.peak_flops,
    )
    if f.config is not None:
      _check_config_flags(f)
      run_config_benchmark(
        config_args(sys.argv[1:]),
        f.out,
        models=select_models(f.models) if f['models'].present else None,
        lengths=parse_lengths(f.lengths) if f['lengths'].present else None,
        dtype=f.dtype if f['dtype'].present else None,
        loop_rounds=f.loop_rounds,
        **common,
      )
      return
    if f.mode == 'loop':
      raise UserError(
        "--mode=loop runs train.py's loop on a task's data; give --config "
        'configs/<task>.py:<model>[,preset] too.'
      )
    # In-process cells resolve the default preset here; a cell's own
    # process does (this one must not take the accelerator from it).
    preset = f.preset or (None if isolated else default_preset())
    lengths = parse_lengths(f.lengths)
    baselines = f.baselines
    if baselines is None:
      baselines = not f['models'].present
    run_benchmark(
      select_models(f.models, baselines),
      lengths,
      f.out,
      preset=preset,
      ceiling=f.ceiling,
      dtype=f.dtype,
      **common,
    )
  except UserError as e:
    print(f'error: {e}', file=sys.stderr)
    sys.exit(2)


# An unknown --config.model.attention.<option> is explained by its core.
cli.set_option_sentence(model_configs.option_sentence)


def run():
  """The command line (benchmark.py; console script lra-benchmark)."""
  define_flags()
  cli.run_main(main, cli.parse_flags)


if __name__ == '__main__':
  run()
