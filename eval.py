r"""Evaluates a checkpoint, or prints the LRA accuracy table of many runs.

python eval.py --workdir DIR [--split test] [--step N | --which latest]
    restores the best checkpoint (default), the latest, or step N, evaluates
    a split and writes DIR/eval_<split>_best.json, eval_<split>_latest.json
    or eval_<split>_step<N>.json (one file per checkpoint evaluated).
python eval.py --workdir DIR --max_length N
    the same at another input length (_len<N> added to the file name): a
    learned position table is extended by copying its trained rows
    (Longformer); models.embeddings.extend_positions_LxE.
python eval.py --table RUNS_DIR
    the LRA accuracy table (Markdown) of every results.json below RUNS_DIR,
    beside the paper's numbers: one row per effective config (runs that
    differ only in seed averaged, with n and spread; a config that differs
    from its task file's is labelled with the differences), each run's
    selected test accuracy (config.select: best validation or, marked, the
    final step), generated-data cells marked (lra/report.py); then the
    pretraining runs (an LM objective) with their losses, token accuracy
    and perplexity.
python eval.py --table RUNS_DIR --bench BENCH_DIR
    also draws the LRA bubble chart (accuracy vs speed, area = memory) of
    those runs and BENCH_DIR/benchmark.json into BENCH_DIR/lra_bubble.png.
python eval.py --plot RUN_OR_RUNS_DIR[,...] [--plot_dir DIR]
    loss and accuracy against step (train and val panels, one line per run)
    from each run's metrics.jsonl: curves_loss.png and curves_accuracy.png in
    DIR (default: the first path given); for runs of an LM objective also
    curves_token_accuracy.png and (causal_lm) curves_perplexity.png;
    lra/curves.py.
"""

import json
import os

from absl import app, flags
import ml_collections

from lra import cli, curves, runtime, steps, tasks, validate
from lra.checkpoints import CheckpointError, Checkpoints
from lra.errors import UserError
from lra.metrics import write_json
from lra.report import bubble_chart, tables
import train

_WORKDIR = flags.DEFINE_string('workdir', None, 'Run directory to evaluate.')
_SPLIT = flags.DEFINE_enum(
  'split', 'test', ['train', 'val', 'test'], 'Split to evaluate.'
)
_STEP = flags.DEFINE_integer('step', None, 'Checkpoint step (default: best).')
_WHICH = flags.DEFINE_enum(
  'which', 'best', ['best', 'latest'], 'Checkpoint set to take the step from.'
)
_MAX_LENGTH = flags.DEFINE_integer(
  'max_length',
  None,
  "Evaluate at this input length instead of the run's max_length; a "
  'learned position table is extended by copying its trained rows '
  '(Longformer). Writes eval_<split>_<which>_len<N>.json.',
)
_TABLE = flags.DEFINE_string(
  'table', None, 'Print the accuracy table of the runs below this directory.'
)
_BENCH = flags.DEFINE_string(
  'bench',
  None,
  'With --table: a benchmark.py --out directory; draws its lra_bubble.png '
  '(accuracy vs speed, circle area = memory).',
)
_DATA_DIR = flags.DEFINE_string(
  'data_dir', None, "Override the run's data_dir."
)
_PLOT = flags.DEFINE_list(
  'plot',
  None,
  'Run folders (or folders of runs), comma-separated: write their loss and '
  'accuracy curves (curves_loss.png, curves_accuracy.png; LM runs: '
  'curves_token_accuracy.png, curves_perplexity.png).',
)
_PLOT_DIR = flags.DEFINE_string(
  'plot_dir', None, 'With --plot: where the PNGs go (default: the first path).'
)
cli.define_process_flags()


def load_config(workdir):
  path = os.path.join(workdir, 'config.json')
  if not os.path.exists(path):
    raise UserError(
      f'{path} does not exist; give the --workdir of a run started by train.py.'
    )
  with open(path) as f:
    saved = json.load(f)
  saved.pop(runtime.CHANGES_KEY, None)
  config = ml_collections.ConfigDict(saved)
  if _DATA_DIR.value:
    validate.check_dir(_DATA_DIR.value, '--data_dir', writable=False)
    config.data_dir = _DATA_DIR.value
  return config


def output_name(split, which, step, step_given):
  """eval_<split>_best.json, eval_<split>_latest.json or
  eval_<split>_step<N>.json: one file per thing evaluated."""
  if step_given:
    return f'eval_{split}_step{step}.json'
  return f'eval_{split}_{which}.json'


def evaluate_checkpoint(
  workdir, split, step=None, which='best', max_length=None
):
  config = load_config(workdir)
  if max_length is not None and max_length < 1:
    raise UserError(
      f'--max_length={max_length} is out of range: it must be an integer '
      f'>= 1, e.g. --max_length={config.max_length}.'
    )
  task = tasks.get_task(config.task)
  replicated, batch_sharding = runtime.make_mesh()
  graphdef, state = train.create_state(config, task, replicated)
  step_given = step is not None
  ckpt = Checkpoints(workdir)
  # A step is looked up in both sets (the best step may be gone from latest).
  which = (
    which
    if step is None
    else next(
      (w for w in (which, 'latest', 'best') if step in ckpt.all_steps(w)), None
    )
  )
  step = ckpt.latest_step(which) if which and step is None else step
  if which is None or step is None:
    raise UserError(
      f'No such checkpoint in {workdir}/checkpoints; saved steps: '
      f'latest {ckpt.all_steps("latest")}, best {ckpt.all_steps("best")}.'
    )
  try:
    state, _ = ckpt.restore(which, step, state)
  except CheckpointError as e:
    raise UserError(
      f'{e.what}; evaluate another saved one with --step N (latest '
      f'{ckpt.all_steps("latest")}, best {ckpt.all_steps("best")}).'
    ) from None
  if max_length and max_length != config.max_length:
    graphdef, state = train.at_length(
      config, task, replicated, state, max_length
    )
    config.max_length = max_length
  data = runtime.load_data(config, task)
  result = runtime.evaluate(
    steps.make_eval_step(graphdef),
    state,
    data[split],
    config,
    batch_sharding,
    desc=split,
  )
  result.update(step=step, split=split, checkpoint=which)
  result['file'] = output_name(split, which, step, step_given)
  if max_length:
    result['max_length'] = max_length
    result['file'] = result['file'][: -len('.json')] + f'_len{max_length}.json'
  if runtime.is_primary():
    write_json(os.path.join(workdir, result['file']), result)
  ckpt.close()
  return result


def main(argv):
  del argv
  train.quiet_logs()
  try:
    if _PLOT.value:
      written, _ = curves.plot(_PLOT.value, _PLOT_DIR.value)
      print('wrote ' + ', '.join(written))
    elif _TABLE.value:
      print(tables(_TABLE.value))
      if _BENCH.value:
        print(f'wrote {bubble_chart(_TABLE.value, _BENCH.value)}')
    elif _BENCH.value:
      raise UserError(
        '--bench needs --table RUNS_DIR, the runs whose accuracy it plots.'
      )
    elif _WORKDIR.value:
      cli.initialize_processes()
      r = evaluate_checkpoint(
        _WORKDIR.value,
        _SPLIT.value,
        _STEP.value,
        _WHICH.value,
        _MAX_LENGTH.value,
      )
      if runtime.is_primary():
        lm = 'token_accuracy' in r  # an LM objective (lra/objectives.py)
        score = (
          f'token accuracy {r["token_accuracy"]:.4f}'
          if lm
          else f'accuracy {r["accuracy"]:.4f}'
        )
        print(
          f'{r["split"]} at step {r["step"]} ({r["checkpoint"]}): {score}, '
          f'loss {r["loss"]:.4f} over {r["count"]} '
          f'{"positions" if lm else "examples"}; wrote '
          f'{os.path.join(_WORKDIR.value, r["file"])}'
        )
    else:
      raise UserError(
        'Give --workdir DIR to evaluate a run, --table RUNS_DIR for the '
        'accuracy table or --plot RUNS for the training curves.'
      )
  except UserError as e:
    cli.exit_with_error(e)


if __name__ == '__main__':
  app.run(main, flags_parser=cli.parse_flags)
