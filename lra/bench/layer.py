r"""One attention layer in isolation: benchmark.py --layer.

  python benchmark.py --layer --models transformer,local,performer,mamba \
    --lengths 1024,2048,4096 --out runs/layer
  python benchmark.py --layer --models transformer,mamba --lengths 32,64 \
    --layer_batch 1 --layer_heads 2 --layer_head_dim 8 --layer_rounds 1 \
    --out /tmp/layer   # seconds: what tests/test_layer_bench.py runs

Each cell (model, length) times ONE layer and nothing else: for an
attention core (models/attention/, contract in models/attention/base.py)
the core alone on q, k, v [B, L, H, D], no projections; for a sequence
mixer (models/mixers/, contract in models/mixers/base.py) the mixer alone
on x [B, L, E], E = H x D, built as models/layers.py MixerSublayer builds it
(registry.build_mixer). Inputs are random normal in the compute dtype, with
a key padding mask of all True passed as an input (as the classifier's
encoder passes one; no position is padded) and causal=False. A model's
options are its `model.attention` block from lra/train/options.py
(attention_defaults: the core's defaults and the model's MODELS entry, no
task's tuned overrides), with options the core resolves from the model
(Longformer's global_positions='auto') resolved as for the Text
classifier (CLS pooling, not causal). Dropout off (rate 0, no key).

Two programs per cell, each jit-compiled once: forward (the layer's
output) and forward + backward (jax.grad of the sum of the output, in
float32, with respect to the inputs and the layer's nnx.Params; for a
shared-QK core, Reformer, k is q). Memory is XLA's compiled memory
analysis of each program (models/attention/memory.py compiled_memory):
'temp', the intermediate buffers, is the layer's own working memory
(inputs, parameters and outputs are 'argument' and 'output', in the JSON).

Timing: per length, every model is compiled and called `warmup` times,
then `rounds` rounds each visit the models in turn (A, B, C, A, B, C, ...)
and time one forward call and one forward + backward call (each waited for
with block_until_ready), so drift on a shared machine hits every model
alike. A row gives the median ms over the rounds with min and max, and the
ratio to 'transformer' (when it was measured at that length): speed-up =
the median over rounds of transformer's ms / the model's ms in the same
round (> 1: faster), memory = the model's fwd+bwd temp / transformer's.
The 1-minute load average is sampled every round (load_1min: min, median,
max), as other work on a shared CPU slows every cell.

A model that fails to build or compile at a length (an option error, an
OOM: a forward + backward whose compiled peak is over 90% of the memory
available is not run) is an 'error' or 'OOM' row with its message; the run
goes on. All cells run in this one process (no per-cell deadline: the
alternation needs every model of a length at hand).

Writes to --out: layer.json (one row per cell, rewritten after each
length, so a killed run keeps what it measured) and layer.md (the table,
also printed).
"""

import gc
import os
import time

from absl import flags
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from lra.bench.cells import environment, failure
from lra.bench.report import failure_lines
from lra.errors import UserError
from lra.train import options as model_options
from lra.train.metrics import write_json
from lra.train.oom import OutOfMemory, memory_limit
from models.attention import registry
from models.attention.base import Mask
from models.attention.memory import compiled_memory
from models.layers import as_dtype

BASELINE = 'transformer'
DEFAULT_BATCH = 2
DEFAULT_HEADS = 4
DEFAULT_HEAD_DIM = 64
DEFAULT_ROUNDS = 10
DEFAULT_WARMUP = 1
# A forward + backward whose compiled peak is over this fraction of the
# memory available is recorded as OOM without running (a CPU host has no
# allocator limit: running it could take the machine down).
MEMORY_FRACTION = 0.9
# The Text classifier's setting, for options resolved from the model.
POOLING, CAUSAL = 'cls', False
# The flags of benchmark.py that do not go with --layer, and what to use.
NOT_WITH_LAYER = {
  'preset': 'the layer sizes are --layer_batch/_heads/_head_dim',
  'ceiling': 'give --models',
  'batch_size': 'use --layer_batch',
  'steps': 'use --layer_rounds',
  'mode': 'a layer is timed call by call',
  'loop_rounds': 'use --layer_rounds',
  'cell_timeout_s': 'every layer runs in this process',
  'peak_flops': 'the layer table has no MFU',
}
LAYER_FLAGS = ('layer_batch', 'layer_heads', 'layer_head_dim', 'layer_rounds')
# One layer.json row per cell; None where a value is unknown. Times in ms
# (median over rounds; *_rounds: every round's), memory in bytes;
# *_speedup and memory_ratio are to 'transformer' at the same length.
ROW_FIELDS = (
  'model',
  'core',
  'kind',
  'length',
  'batch_size',
  'num_heads',
  'head_dim',
  'emb_dim',
  'dtype',
  'inputs',
  'status',
  'error',
  'num_params',
  'compile_seconds',
  'warmup',
  'rounds',
  'fwd_ms',
  'fwd_ms_min',
  'fwd_ms_max',
  'fwd_bwd_ms',
  'fwd_bwd_ms_min',
  'fwd_bwd_ms_max',
  'fwd_temp_bytes',
  'fwd_bwd_temp_bytes',
  'fwd_memory',
  'fwd_bwd_memory',
  'fwd_speedup',
  'fwd_bwd_speedup',
  'memory_ratio',
  'fwd_ms_rounds',
  'fwd_bwd_ms_rounds',
  'load_1min',
  'attention',
  'backend',
  'device_kind',
  'device_count',
  'jax_version',
  'flax_version',
)


# ---------------------------------------------------------------- build
def layer_options(model, overrides=None):
  """The model's `model.attention` block (lra/train/options.py) as a dict,
  `overrides` over it, checked (an unknown option or a bad value: one
  UserError sentence) and resolved as the Text classifier resolves it."""
  values = {**model_options.attention_defaults(model), **(overrides or {})}
  block = model_options.attention_block(values).to_dict()
  resolve = getattr(
    registry.get_core_class(block['name']), 'model_options', None
  )
  return resolve(block, pooling=POOLING, causal=CAUSAL) if resolve else block


class Cell:
  """One compiled layer at one length: fwd() and fwd_bwd() run it."""

  def __init__(self, row, options, sizes, seed=0):
    b, length, h, d = row['batch_size'], row['length'], sizes[0], sizes[1]
    dtype = as_dtype(row['dtype'])
    cls = registry.get_core_class(options['name'])
    mixer = registry.is_mixer(cls)
    common = dict(
      num_heads=h,
      max_length=length,
      dropout_rate=0.0,
      dtype=dtype,
      rngs=nnx.Rngs(seed),
    )
    if mixer:
      layer = registry.build_mixer(options, emb_dim=h * d, **common)
    else:
      layer = registry.build(options, head_dim=d, **common)
    graphdef, params, rest = nnx.split(layer, nnx.Param, ...)
    del layer
    shared_qk = not mixer and cls.shared_qk
    shape = (b, length, h * d) if mixer else (b, length, h, d)
    names = ['x'] if mixer else (['q', 'v'] if shared_qk else ['q', 'k', 'v'])
    keys = jax.random.split(jax.random.key(seed + 1), len(names))
    self.inputs = tuple(
      jax.random.normal(k, shape, jnp.float32).astype(dtype) for k in keys
    )
    self.params, self.rest = params, rest
    self.padding = jnp.ones((b, length), bool)
    row.update(
      core=options['name'],
      kind='mixer' if mixer else 'attention',
      inputs=f'{",".join(names)} [{",".join(map(str, shape))}]',
      num_params=int(sum(x.size for x in jax.tree.leaves(params))),
    )

    def forward(params, rest, inputs, padding_BxL):
      module = nnx.merge(graphdef, params, rest)
      mask = Mask(padding_BxL, CAUSAL)
      if mixer:
        out, _ = module(inputs[0], mask)
      elif shared_qk:
        out, _ = module(inputs[0], inputs[0], inputs[1], mask)
      else:
        out, _ = module(*inputs, mask)
      return out

    def loss(params, rest, inputs, padding_BxL):
      out = forward(params, rest, inputs, padding_BxL)
      return jnp.sum(out.astype(jnp.float32))

    args = (self.params, self.rest, self.inputs, self.padding)
    start = time.perf_counter()
    self.fwd_compiled = jax.jit(forward).lower(*args).compile()
    grad = jax.jit(jax.grad(loss, argnums=(0, 2)))
    self.fwd_bwd_compiled = grad.lower(*args).compile()
    row['compile_seconds'] = time.perf_counter() - start
    fwd, fwd_bwd = (
      compiled_memory(c) for c in (self.fwd_compiled, self.fwd_bwd_compiled)
    )
    row.update(
      fwd_memory=fwd,
      fwd_bwd_memory=fwd_bwd,
      fwd_temp_bytes=fwd['temp'],
      fwd_bwd_temp_bytes=fwd_bwd['temp'],
    )

  def _timed(self, compiled):
    start = time.perf_counter()
    jax.block_until_ready(
      compiled(self.params, self.rest, self.inputs, self.padding)
    )
    return (time.perf_counter() - start) * 1e3

  def fwd(self):
    return self._timed(self.fwd_compiled)

  def fwd_bwd(self):
    return self._timed(self.fwd_bwd_compiled)


# -------------------------------------------------------------- measure
def load_1min():
  return os.getloadavg()[0] if hasattr(os, 'getloadavg') else None


def base_row(model, length, batch, heads, head_dim, dtype, rounds, warmup):
  row = dict.fromkeys(ROW_FIELDS)
  row.update(
    model=model,
    length=length,
    batch_size=batch,
    num_heads=heads,
    head_dim=head_dim,
    emb_dim=heads * head_dim,
    dtype=dtype,
    rounds=rounds,
    warmup=warmup,
    status='running',
  )
  row.update(environment())
  return row


def _spread(values):
  return float(np.median(values)), float(min(values)), float(max(values))


def add_ratios(rows):
  """Each ok row's speed-ups and memory ratio to the 'transformer' row of
  its length (None where that row is missing or failed)."""
  base = {
    r['length']: r
    for r in rows
    if r['model'] == BASELINE and r['status'] == 'ok'
  }
  for r in rows:
    b = base.get(r['length'])
    if r['status'] != 'ok' or b is None:
      continue
    for name in ('fwd', 'fwd_bwd'):
      ratios = [
        t0 / t
        for t0, t in zip(
          b[f'{name}_ms_rounds'], r[f'{name}_ms_rounds'], strict=True
        )
      ]
      r[f'{name}_speedup'] = float(np.median(ratios))
    temp0 = b['fwd_bwd_temp_bytes']
    r['memory_ratio'] = r['fwd_bwd_temp_bytes'] / temp0 if temp0 else None


def measure_length(models, length, sizes, *, options, log):
  """The rows of every model at one length: build and compile each, warm
  up, then sizes['rounds'] alternating rounds."""
  b, h, d = sizes['batch'], sizes['heads'], sizes['head_dim']
  rows, cells = [], {}
  limit = memory_limit()
  for model in models:
    row = base_row(
      model, length, b, h, d, sizes['dtype'], sizes['rounds'], sizes['warmup']
    )
    rows.append(row)
    try:
      row['attention'] = layer_options(model, (options or {}).get(model))
      cell = Cell(row, row['attention'], (h, d))
      peak = row['fwd_bwd_memory']['peak']
      if limit and peak > MEMORY_FRACTION * limit:
        raise OutOfMemory(
          f'needs {peak / 1e9:.2f} GB by XLA memory analysis, '
          f'{limit / 1e9:.2f} GB available'
        )
      cells[model] = cell
      log(
        f'  {model} L={length}: compiled in {row["compile_seconds"]:.1f} s, '
        f'temp fwd {row["fwd_temp_bytes"] / 1e6:.3g} MB, fwd+bwd '
        f'{row["fwd_bwd_temp_bytes"] / 1e6:.3g} MB'
      )
    except Exception as e:  # pylint: disable=broad-except
      row['status'], row['error'] = failure(e)
      log(f'  {model} L={length}: {row["status"]} ({row["error"]})')
      gc.collect()
  times = {m: ([], []) for m in cells}
  loads = []
  for i in range(sizes['warmup'] + sizes['rounds']):
    for model, cell in list(cells.items()):
      try:
        fwd, fwd_bwd = cell.fwd(), cell.fwd_bwd()
      except Exception as e:  # pylint: disable=broad-except
        row = next(r for r in rows if r['model'] == model)
        row['status'], row['error'] = failure(e)
        del cells[model]
        continue
      if i >= sizes['warmup']:
        times[model][0].append(fwd)
        times[model][1].append(fwd_bwd)
    if i >= sizes['warmup']:
      loads.append(load_1min())
  load = None
  if loads and None not in loads:
    load = dict(zip(('median', 'min', 'max'), _spread(loads), strict=True))
  for row in rows:
    row['load_1min'] = load
    if row['model'] not in cells:
      continue
    row['status'] = 'ok'
    for name, values in zip(
      ('fwd', 'fwd_bwd'), times[row['model']], strict=True
    ):
      row[f'{name}_ms_rounds'] = values
      median, low, high = _spread(values)
      row.update({f'{name}_ms': median, f'{name}_ms_min': low})
      row[f'{name}_ms_max'] = high
  cells.clear()
  gc.collect()
  return rows


def check_sizes(batch, heads, head_dim, rounds, warmup):
  """Each size a positive integer (warmup >= 0), else UserError."""
  for flag, value, lowest in (
    ('--layer_batch', batch, 1),
    ('--layer_heads', heads, 1),
    ('--layer_head_dim', head_dim, 1),
    ('--layer_rounds', rounds, 1),
    ('--warmup', warmup, 0),
  ):
    if isinstance(value, bool) or not isinstance(value, int) or value < lowest:
      raise UserError(
        f'{flag}={value} is out of range: it must be an integer >= '
        f'{lowest}, e.g. {flag}={max(lowest, 2)}.'
      )


def run_layer_bench(
  models,
  lengths,
  out,
  *,
  batch=DEFAULT_BATCH,
  heads=DEFAULT_HEADS,
  head_dim=DEFAULT_HEAD_DIM,
  rounds=DEFAULT_ROUNDS,
  warmup=DEFAULT_WARMUP,
  dtype='float32',
  options=None,
  log=print,
):
  """Measures one layer of every model at every length; writes
  out/layer.json and out/layer.md, prints the table, returns the rows
  (model-major, in the order given; a failed cell is an 'error' or 'OOM'
  row). options: {model: {option: value}} over a model's
  lra/train/options.py block. log: where progress lines go (None: nowhere)."""
  check_sizes(batch, heads, head_dim, rounds, warmup)
  as_dtype(dtype)
  log = log or (lambda *_: None)
  os.makedirs(out, exist_ok=True)
  sizes = dict(
    batch=batch,
    heads=heads,
    head_dim=head_dim,
    rounds=rounds,
    warmup=warmup,
    dtype=dtype,
  )
  start = time.perf_counter()
  load_start = load_1min()
  by_cell = {}

  def ordered():
    return [by_cell[m, n] for m in models for n in lengths if (m, n) in by_cell]

  for length in lengths:
    log(f'L={length}: {len(models)} model(s), {rounds} round(s)')
    for row in measure_length(models, length, sizes, options=options, log=log):
      by_cell[row['model'], length] = row
    add_ratios(ordered())
    write_json(os.path.join(out, 'layer.json'), ordered())
  rows = ordered()
  seconds = time.perf_counter() - start
  text = markdown(rows, seconds=seconds, load_start=load_start)
  with open(os.path.join(out, 'layer.md'), 'w') as f:
    f.write(text)
  log(text)
  log(f'{len(rows)} cells in {seconds:.0f} s; wrote {out}/layer.md')
  return rows


# --------------------------------------------------------------- report
def _num(x):
  return '-' if x is None else (f'{x:.3g}' if x < 1000 else f'{x:.0f}')


def _ms(row, name):
  return (
    f'{_num(row[f"{name}_ms"])} '
    f'({_num(row[f"{name}_ms_min"])}-{_num(row[f"{name}_ms_max"])})'
  )


def _x(value):
  return '' if value is None else f'{value:.2f}x'


def markdown(rows, seconds=None, load_start=None):
  """The per-layer table: one line per (model, length)."""
  first = next((r for r in rows if r.get('backend')), rows[0])
  loads = [r['load_1min'] for r in rows if r.get('load_1min')]
  load = ''
  if loads:
    lo = min(x['min'] for x in loads)
    hi = max(x['max'] for x in loads)
    load = f'; 1-minute load average {lo:.1f}-{hi:.1f} during the rounds'
    if load_start is not None:
      load += f' ({load_start:.1f} at the start)'
  took = '' if seconds is None else f'; measured in {seconds:.0f} s'
  has_base = any(r['model'] == BASELINE and r['status'] == 'ok' for r in rows)
  ratios = (
    'speed-up = median over rounds of `transformer` ms / the model ms in '
    'the same round (> 1: faster); memory x = fwd+bwd temp / '
    "`transformer`'s, at the same length."
    if has_base
    else 'no ratios: `transformer` was not measured in this run.'
  )
  lines = [
    '## One attention layer (forward, forward + backward)',
    '',
    f'Machine: {first["device_kind"]} ({first["backend"]} backend), '
    f'{os.cpu_count()} CPU cores{load}; jax {first["jax_version"]}, '
    f'flax {first["flax_version"]}{took}.',
    f'Layer: B={first["batch_size"]}, H={first["num_heads"]}, '
    f'D={first["head_dim"]} (E={first["emb_dim"]} for mixers), '
    f'{first["dtype"]}; an attention core alone on q, k, v [B, L, H, D], '
    'a sequence mixer alone on x [B, L, E]; key padding mask all True, '
    'not causal, no dropout; options from lra/train/options.py.',
    f'Timing: ms per call, median (min-max) of {first["rounds"]} '
    f'alternating round(s) after {first["warmup"]} warm-up call(s); '
    'fwd+bwd = jit(grad of the sum of the output) w.r.t. the inputs and '
    'parameters.',
    "Memory: MB (10^6 bytes) of XLA's compiled temp buffers (memory "
    'analysis) of each program; ' + ratios,
    '',
    '| model | L | fwd ms | fwd+bwd ms | fwd MB | fwd+bwd MB '
    '| speed-up fwd | speed-up fwd+bwd | memory x |',
    '|---|---:|---:|---:|---:|---:|---:|---:|---:|',
  ]
  for r in rows:
    head = f'| {r["model"]} | {r["length"]} |'
    if r['status'] != 'ok':
      lines.append(head + f' {r["status"]} |' + ' |' * 7)
      continue
    lines.append(
      head
      + ' '
      + ' | '.join(
        [
          _ms(r, 'fwd'),
          _ms(r, 'fwd_bwd'),
          _num(r['fwd_temp_bytes'] / 1e6),
          _num(r['fwd_bwd_temp_bytes'] / 1e6),
          _x(r['fwd_speedup']),
          _x(r['fwd_bwd_speedup']),
          _x(r['memory_ratio']),
        ]
      )
      + ' |'
    )
  lines += failure_lines(rows)
  return '\n'.join(lines) + '\n'


# ---------------------------------------------------------------- flags
def define_flags():
  """The --layer_* flags of benchmark.py (its define_flags calls this)."""
  flags.DEFINE_integer(
    'layer_batch', DEFAULT_BATCH, '--layer: batch size B.', lower_bound=1
  )
  flags.DEFINE_integer(
    'layer_heads', DEFAULT_HEADS, '--layer: heads H.', lower_bound=1
  )
  flags.DEFINE_integer(
    'layer_head_dim',
    DEFAULT_HEAD_DIM,
    '--layer: head dim D (a mixer gets E = H x D).',
    lower_bound=1,
  )
  flags.DEFINE_integer(
    'layer_rounds',
    DEFAULT_ROUNDS,
    '--layer: timed rounds, each visiting every model of a length once.',
    lower_bound=1,
  )


def check_flags(f):
  """UserError for flags that do not go with --layer, or need it."""
  if not f.layer:
    given = [name for name in LAYER_FLAGS if f[name].present]
    if given:
      raise UserError(f'--{given[0]} is for --layer; add --layer.')
    return
  if f.config is not None:
    raise UserError(
      '--layer times one attention layer of each --models name; it does '
      'not take --config.'
    )
  for name, instead in NOT_WITH_LAYER.items():
    if f[name].present:
      raise UserError(f'--{name} does not go with --layer: {instead}.')


def main(f, models, lengths):
  """benchmark.py --layer with the parsed --models and --lengths."""
  check_flags(f)
  run_layer_bench(
    models,
    lengths,
    f.out,
    batch=f.layer_batch,
    heads=f.layer_heads,
    head_dim=f.layer_head_dim,
    rounds=f.layer_rounds,
    warmup=DEFAULT_WARMUP if f.warmup is None else f.warmup,
    dtype=f.dtype,
  )
