r"""Where the gradient goes: per-parameter gradient norms of a run.

  python -m experiments.mamba_recall.gradients --workdir runs/mq [--batches 4] [--out g.md]

For the run's freshly initialised model (step 0, its seed) and for each of
its kept checkpoints (latest and best), the gradient of the training loss
on --batches training batches (the loss train.py minimises, no dropout):
per parameter, the root-mean-square gradient, the root-mean-square value
and their ratio (the relative step a plain SGD step of rate 1 would take),
as a markdown table, largest ratio first within each layer. A parameter
whose gradient has vanished shows as a ratio orders of magnitude below its
layer's others (issue #33: is Mamba's dt, A or B/C starved?).
"""

import sys

from absl import flags
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from lra.errors import UserError
from lra.train import batching, build, runtime, steps
from lra.train.checkpoints import Checkpoints
from lra.train.cli import exit_with_error, quiet_logs, run_main
from lra.train.load import load_run

FLAGS = flags.FLAGS


def define_flags():
  """The command's flags (defined on running it, not on importing the
  module: the tests import gradient_table beside other commands' flags)."""
  flags.DEFINE_string('workdir', None, 'A train.py run folder.')
  flags.DEFINE_integer('batches', 4, 'Training batches averaged over.')
  flags.DEFINE_string('out', None, 'Also write the tables to this file.')


def gradient_table(graphdef, state, config, task, data, batches):
  """[(name, grad rms, value rms)] over the parameters, gradients averaged
  over `batches` training batches."""

  @jax.jit
  def grads_of(state, batch):
    model, _ = nnx.merge(graphdef, state)
    return nnx.grad(steps.batch_loss, has_aux=True)(model, batch)[0]

  total = None
  for i in range(batches):
    batch = batching.training_batch(config, task, data, [], i)
    g = grads_of(state, {k: jnp.asarray(v) for k, v in batch.items()})
    g = nnx.state(g, nnx.Param)
    total = g if total is None else jax.tree.map(jnp.add, total, g)
  model, _ = nnx.merge(graphdef, state)
  params = nnx.state(model, nnx.Param)
  rows = []
  flat_g = jax.tree_util.tree_flatten_with_path(total)[0]
  flat_p = jax.tree_util.tree_flatten_with_path(params)[0]
  for (path, g), (_, p) in zip(flat_g, flat_p):
    name = '.'.join(str(k) for k in steps.parameter_key(path))
    g = np.asarray(g, np.float64) / batches
    p = np.asarray(p, np.float64)
    rows.append((name, np.sqrt(np.mean(g**2)), np.sqrt(np.mean(p**2))))
  return rows


def markdown(rows, title):
  lines = [
    f'### {title}',
    '',
    '| parameter | grad rms | value rms | grad / value |',
    '|---|---|---|---|',
  ]
  for name, g, p in rows:
    ratio = g / p if p > 0 else float('inf')
    lines.append(f'| `{name}` | {g:.2e} | {p:.2e} | {ratio:.2e} |')
  return '\n'.join(lines) + '\n'


def main(argv):
  try:
    report(argv)
  except UserError as e:
    exit_with_error(e)


def report(argv):
  if len(argv) > 1:
    raise UserError(f'Unexpected argument {argv[1]!r}; see --help.')
  quiet_logs()
  if not FLAGS.workdir:
    raise UserError('--workdir is required: a train.py run folder.')
  first = load_run(FLAGS.workdir, 'latest')
  config, task = first.config, first.task
  data = runtime.load_data(config, task, progress=False)
  fresh_graphdef, fresh_state = build.create_state(config, task, None)
  runs = [('initialisation (step 0)', fresh_graphdef, fresh_state)]
  ckpt = Checkpoints(FLAGS.workdir, keep=config.keep_checkpoints)
  try:
    kept = {w: ckpt.all_steps(w) for w in ('latest', 'best')}
  finally:
    ckpt.close(quiet=True)
  for which, kept_steps in kept.items():
    for step in kept_steps:
      r = first if (which, step) == ('latest', first.step) else None
      r = r or load_run(FLAGS.workdir, which, step)
      runs.append((f'{which} checkpoint, step {step}', r.graphdef, r.state))
  text = [f'Gradients of {FLAGS.workdir} ({FLAGS.batches} batches)\n']
  for title, graphdef, state in runs:
    rows = gradient_table(graphdef, state, config, task, data, FLAGS.batches)
    text.append(markdown(rows, title))
  out = '\n'.join(text)
  sys.stdout.write(out)
  if FLAGS.out:
    with open(FLAGS.out, 'w') as f:
      f.write(out)


if __name__ == '__main__':
  define_flags()
  run_main(main)
