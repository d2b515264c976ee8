"""The measurement of one cell: a training step's speed, memory and FLOPs.

Each Text cell (model, length) times full training steps (forward,
backward and AdamW update, lra.train.steps.make_train_step) of the
byte-level Text classifier (configs/text.py, max_length = length) on
random bytes, so no data set is needed; a --config cell times that
config's step on random inputs of its batches' shapes
(lra.train.batching.random_batch). Speed is the median of the timed steps
after compilation and warm-up (--mode latency) or the rate of steps
dispatched back to back (throughput). Memory is the compiled train step's
from XLA's memory analysis (temp + arguments + outputs - donated aliases,
per device), which is comparable across backends; on GPU/TPU the device's
own peak is recorded too. A step whose compiled peak is over 95% of the
memory available is recorded as OOM without running.

examples_per_sec = steps/s x batch, tokens_per_sec = x max_length x
documents per example (CLS not counted), and mfu, model FLOP utilisation =
flops_per_step (XLA's cost analysis of the compiled step, per device) x
steps/s / the device's peak dense FLOP/s for the cell's dtype (PEAK_FLOPS
below, or --peak_flops). mfu is null where the peak is unknown (CPU) and
does not count FLOPs inside custom calls (cuDNN fused attention).

--mode loop runs train.py's train_and_evaluate on the config's data beside
the bare step (measure_loop).
"""

import gc
import os
import tempfile
import time

from flax import nnx
import jax
import numpy as np

from lra import data as tasks
from lra.bench.cells import (
  base_row,
  environment,
  failure,
  model_summary,
  resolved,
  spec_config,
)
from lra.train import batching, build, loop, objectives, runtime, steps
from lra.train.metrics import read_rows
from lra.train.oom import OutOfMemory, memory_limit
from models.attention.memory import compiled_memory
import models.attention.none  # noqa: F401 (registers 'none' for --ceiling)

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


def fused_kernel_of(compiled):
  """'cudnn' when the compiled step calls cuDNN's fused attention (what
  jax.nn.dot_product_attention picks on NVIDIA GPUs for bf16/fp16), else
  None: on CPU, or for f32, XLA writes the attention out as plain ops."""
  try:
    text = compiled.as_text()
  except Exception:  # pylint: disable=broad-except
    return None
  return 'cudnn' if '__cudnn$fmha' in text else None


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
  batch = runtime.to_device(batching.random_batch(config, task), batch_sharding)

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
      loop.train_and_evaluate(loop_config(config, num_steps), workdir)
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
