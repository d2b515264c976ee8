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
AdamW update) of the byte-level Text classifier (configs/text.py, max_length
= length) on random bytes, so no data set is needed: steps/s, the compiled
step's memory (XLA's memory analysis), FLOPs, examples/s, tokens/s and MFU
(lra/bench/measure.py). docs/benchmarking.md is the manual; in short:

  --config FILE:MODEL[,preset]  that config's training step instead (with
      its --config.* overrides, its batch and length), on random inputs of
      a training batch's shapes; --models runs it for each model.
  --layer  one attention core or mixer alone, forward and forward +
      backward, every model of a length in alternating rounds
      (lra/bench/layer.py; sizes --layer_batch/_heads/_head_dim/_rounds).
  --models  'all' (the default) or a list, measured as listed (the grammar
      of lra/train/names.py); --baselines puts 'transformer' (einsum, as
      LRA measured) and 'transformer_fused' in front (on by default only
      when --models is not given). Ratios are to 'transformer' when it was
      measured.
  --ceiling  a first row 'ceiling': the transformer's Text config with
      attention 'none' (out = v; models/attention/none.py), the fastest any
      attention could be at that width; never trained, never in --table.
  --preset  paper (the Text reference model, batch 32 on this machine's
      devices where the paper split it over 16 TPU v3 chips: only ratios
      compare), cpu (the default on CPU: 2 layers, width 64, batch 2) or
      tiny (tests); cells.py PRESETS. --batch_size/--steps/--warmup win.
  --mode  latency (each step waited for and timed; the median), throughput
      (steps back to back, one wait) or loop (needs --config: train.py's
      loop against the bare step, --loop_rounds pairs side by side).
  --cell_timeout_s  each cell in its own process, killed past the deadline
      and recorded as 'timeout' (lra/bench/isolate.py); 0: in this process.
  --dtype bfloat16  every cell in bfloat16 (params float32); a row's
      fused_attention_kernel says when cuDNN's fused attention ran.
  --peak_flops  one device's peak FLOP/s for the MFU (default: measure.py
      PEAK_FLOPS by device kind; unknown on CPU).

Writes to --out: benchmark.json (one row per cell, rewritten after each
cell, so a killed run keeps what it measured), benchmark.md (Table 2
layout, the paper's numbers beside ours; a throughput table), speed.png and
memory.png, and cells/ (each cell process's log and row). A cell that runs
out of memory reads "OOM", one that fails "error", one past its deadline
"timeout" (its message is in the JSON and under the table); the rest go on.
"""

import sys

from absl import flags, logging

from lra.bench import layer as layer_bench
from lra.bench.cells import PRESETS, default_preset
from lra.bench.isolate import run_cells, run_child
from lra.bench.report import CEILING
from lra.errors import UserError
from lra.train import cli, options, runtime, validate
from lra.train import config as config_loader
from lra.train.names import select_names

BASELINES = ('transformer', 'transformer_fused')


MODES = ('latency', 'throughput', 'loop')


DEFAULT_CELL_TIMEOUT_S = 300.0


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


def select_models(spec, baselines=False):
  """'all' or 'a,b,-c' -> model names (lra/train/names.py): every known
  model for 'all', else the listed ones, after the BASELINES when
  `baselines`; '-name' drops one."""
  return select_names(
    spec,
    options.known_models(),
    '--models',
    noun='model',
    first=BASELINES if baselines else (),
  )


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


# ---------------------------------------------------------------- flags
def define_flags():
  """Flags of the command line (defined here so importing defines none)."""
  config_loader.define_config_flag(
    'config',
    None,
    "configs/<task>.py:<model>[,<preset>]: benchmark that config's "
    'training step (with --config.<key>=<value> overrides) instead of the '
    'Text cells.',
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
  if stray := cli.stray_argument(argv):
    cli.exit_with_error(stray)
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


def run():
  """The command line (benchmark.py; console script lra-benchmark)."""
  define_flags()
  cli.run_main(main, cli.parse_flags)


if __name__ == '__main__':
  run()
