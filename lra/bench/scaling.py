r"""Compiled memory and compile time of one training step under the memory
tools: the README's scaling table (scaling.py in a checkout; lra-scaling
once installed; `python -m lra.bench.scaling`).

  python scaling.py [--config configs/text.py:transformer] \
      [--length 4096] [--batch 4] [--accum 4] [--layers 0]

For each variant (plain; model.remat; model.scan_layers; both; bfloat16;
gradient accumulation: --accum micro-batches of batch/accum at the same
effective batch) it compiles the train step of lra/train/steps.py (AdamW update
included) for one device, without running it, and prints a Markdown table:
XLA's compiled temporary memory (exact: its buffer assignment), arguments
(parameters + optimizer state + batch) and the seconds `lower` + `compile`
took. Nothing is allocated, so the paper's width at 4K fits any machine.
"""

from lra.train.interrupt import on_ctrl_c_exit

# Ctrl-C while the program loads: one line, exit 130 (run as `python -m
# lra.bench.scaling`; importing it sets nothing; scaling.py sets the same).
if __name__ == '__main__':
  on_ctrl_c_exit()


import time

from absl import flags
from flax import nnx
import jax
import jax.numpy as jnp

from lra import data as tasks
from lra.train import cli, steps
from lra.train import config as config_loader
from models.classifier import build_model


def define_flags():
  config_loader.define_config_flag(
    'config', 'configs/text.py:transformer', 'configs/<task>.py:<model>'
  )
  flags.DEFINE_integer('length', 4096, 'Sequence length.')
  flags.DEFINE_integer('batch', 4, 'Effective batch (one device).')
  flags.DEFINE_integer('accum', 4, 'Micro-batches of the accum row.')
  flags.DEFINE_integer('layers', 0, 'Blocks (0: the config).')


VARIANTS = (
  ('plain', {}),
  ('remat', {'model.remat': True}),
  ('scan_layers', {'model.scan_layers': True}),
  ('scan_layers + remat', {'model.scan_layers': True, 'model.remat': True}),
  ('bfloat16', {'dtype': 'bfloat16'}),
  ('grad accumulation', {'grad_accum_steps': None}),  # set from --accum
)


def measure(config, task, batch):
  """(temp bytes, argument bytes, compile seconds) of the train step."""

  def create():
    model = build_model(config, task)
    optimizer = nnx.Optimizer(
      model, steps.make_optimizer(config), wrt=nnx.Param
    )
    return nnx.split((model, optimizer))

  graphdef, _ = create()
  state = jax.eval_shape(lambda: create()[1])
  shape = (batch, config.max_length)
  spec = {
    'inputs': jax.ShapeDtypeStruct(shape, jnp.int32),
    'labels': jax.ShapeDtypeStruct((batch,), jnp.int32),
    'weights': jax.ShapeDtypeStruct((batch,), jnp.float32),
  }
  key = jax.eval_shape(lambda: jax.random.key(0))
  start = time.perf_counter()
  compiled = steps.make_train_step(graphdef).lower(state, spec, key).compile()
  seconds = time.perf_counter() - start
  m = compiled.memory_analysis()
  return m.temp_size_in_bytes, m.argument_size_in_bytes, seconds


def main(argv):
  del argv
  f = flags.FLAGS
  base = f.config
  task = tasks.get_task(base.task)
  rows = []
  for name, overrides in VARIANTS:
    config = base.copy_and_resolve_references()
    config.unlock()
    config.max_length = f.length
    if f.layers:
      config.model.num_layers = f.layers
    batch = f.batch
    for key, value in overrides.items():
      if key == 'grad_accum_steps':
        value, batch = f.accum, f.batch // f.accum
        name = f'grad accumulation ({f.accum} x {batch})'
      node, leaf = config, key.split('.')
      for part in leaf[:-1]:
        node = node[part]
      node[leaf[-1]] = value
    temp, args, seconds = measure(config, task, batch)
    rows.append((name, temp, args, seconds))
    print(f'{name}: temp {temp / 2**20:.0f} MiB, compile {seconds:.1f} s')
  m = base.model
  print(
    f'\n{base.task} {base.model_name}, length {f.length}, '
    f'{f.layers or m.num_layers} layers, emb {m.emb_dim}, mlp '
    f'{m.mlp_dim}, {m.num_heads} heads, effective batch {f.batch}, one '
    f'{jax.devices()[0].platform} device\n'
  )
  print('| variant | compiled temp | arguments | compile |')
  print('|---|---:|---:|---:|')
  plain = rows[0][1]
  for name, temp, args, seconds in rows:
    print(
      f'| {name} | {temp / 2**20:,.0f} MiB ({temp / plain:.2f}x) | '
      f'{args / 2**20:,.0f} MiB | {seconds:.1f} s |'
    )


def run():
  """The command line: scaling.py, `python -m lra.bench.scaling`,
  lra-scaling."""
  define_flags()
  cli.run_main(main, cli.parse_flags, usage=__doc__)


if __name__ == '__main__':
  run()
