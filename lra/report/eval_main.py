r"""Evaluates a checkpoint, or prints the LRA accuracy table of many runs
(eval.py in a checkout; lra-eval once installed).

python eval.py --workdir DIR [--split test] [--step N | --which latest]
    restores the best checkpoint (default), the latest, or step N, evaluates
    a split and writes DIR/eval_<split>_best.json, eval_<split>_latest.json
    or eval_<split>_step<N>.json (one file per checkpoint evaluated).
python eval.py --workdir DIR --max_length N
    the same at another input length (_len<N> added to the file name): a
    learned position table is extended by copying its trained rows
    (Longformer); models.embeddings.extend_positions_LxE.
python eval.py --workdir DIR --config.model.attention.<option>=<value> ...
    the same with other options of the run's attention core (e.g. Reformer's
    num_hashes=8): only options that keep the trained parameters' shapes
    (checked by building both models abstractly, nnx.eval_shape; one that
    changes them is refused with one sentence naming it). The file gets
    the changed options in its name and records them ('eval_options', and
    their 'trained_options').
python eval.py --table RUNS_DIR
    the LRA accuracy table (Markdown) of every results.json below RUNS_DIR,
    beside the paper's numbers: one row per effective config (runs that
    differ only in seed averaged, with n and spread; a config that differs
    from its task file's is labelled with the differences), each run's
    selected test accuracy (config.select: best validation or, marked, the
    final step), generated-data cells marked (lra/report/tables.py); then the
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
    lra/report/curves.py.

A checkpoint is opened by lra.load_run (lra/train/load.py): one step lookup
and one set of error sentences for the program and the library.
"""

from lra.train.interrupt import on_ctrl_c_exit

# Ctrl-C while the program loads: one line, exit 130 (run as `python -m
# lra.report.eval_main`; importing it sets nothing; eval.py sets the same).
if __name__ == '__main__':
  on_ctrl_c_exit()

import json
import os
import re

from absl import flags
import ml_collections

from lra import data as tasks
from lra.errors import UserError
from lra.report import curves
from lra.report.bubble import bubble_chart
from lra.report.tables import tables
from lra.train import cli, options, processes, runtime, validate
from lra.train.load import load_run, saved_config
from lra.train.metrics import write_json


def define_flags():
  flags.DEFINE_string('workdir', None, 'Run directory to evaluate.')
  flags.DEFINE_enum(
    'split', 'test', ['train', 'val', 'test'], 'Split to evaluate.'
  )
  flags.DEFINE_integer('step', None, 'Checkpoint step (default: best).')
  flags.DEFINE_enum(
    'which', 'best', ['best', 'latest'], 'Checkpoint set to take the step from.'
  )
  flags.DEFINE_integer(
    'max_length',
    None,
    "Evaluate at this input length instead of the run's max_length; a "
    'learned position table is extended by copying its trained rows '
    '(Longformer). Writes eval_<split>_<which>_len<N>.json.',
  )
  flags.DEFINE_string(
    'table', None, 'Print the accuracy table of the runs below this directory.'
  )
  flags.DEFINE_string(
    'bench',
    None,
    'With --table: a benchmark.py --out directory; draws its lra_bubble.png '
    '(accuracy vs speed, circle area = memory).',
  )
  flags.DEFINE_string('data_dir', None, "Override the run's data_dir.")
  flags.DEFINE_list(
    'plot',
    None,
    'Run folders (or folders of runs), comma-separated: write their loss '
    'and accuracy curves (curves_loss.png, curves_accuracy.png; LM runs: '
    'curves_token_accuracy.png, curves_perplexity.png).',
  )
  flags.DEFINE_string(
    'plot_dir',
    None,
    'With --plot: where the PNGs go (default: the first path).',
  )
  cli.define_process_flags()


def load_config(workdir, data_dir=None):
  """The run's saved config (lra/train/load.py saved_config), with
  `data_dir` (checked) in place of its own when given."""
  config = saved_config(workdir)
  if data_dir:
    validate.check_dir(data_dir, '--data_dir', writable=False)
    config.data_dir = data_dir
  return config


def _with_attention(saved, block):
  """A ConfigDict of the `saved` config dict with model.attention = block."""
  config = ml_collections.ConfigDict(saved)
  config.model.attention = options.attention_block(block)
  return config


def _shapes(config, task):
  """{state path: (shape, dtype)} of the model `config` builds, abstractly
  (nnx.eval_shape: nothing is allocated or computed)."""
  from flax import nnx  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top

  from models.classifier import build_model  # pylint: disable=g-import-not-at-top

  model = nnx.eval_shape(lambda: build_model(config, task))
  leaves = jax.tree_util.tree_leaves_with_path(nnx.state(model))

  def dotted(path):
    keys = [
      str(getattr(k, 'key', getattr(k, 'idx', getattr(k, 'name', k))))
      for k in path
    ]
    return '.'.join(keys[:-1] if keys[-1:] == ['value'] else keys)

  return {dotted(p): (tuple(x.shape), str(x.dtype)) for p, x in leaves}


def _shape_change(before, after):
  """'path: (4, 8) -> (4, 16)' of the first state entry that differs."""
  for key in sorted(set(before) | set(after)):
    if before.get(key) != after.get(key):
      old, new = (
        'absent' if v is None else str(v[0])
        for v in (before.get(key), after.get(key))
      )
      return f'{key}: {old} -> {new}'
  return None


def with_eval_options(config, task, overrides):
  """(config with the `overrides` applied, {option: (trained value, value
  now)} of the options they change): --config.model.attention.<option>=
  <value> strings, parsed as train.py parses them. UserError when one
  changes the shapes of the trained state (the checkpoint would not fit):
  the sentence names the option."""
  from models.attention import registry  # pylint: disable=g-import-not-at-top

  saved = json.loads(config.to_json())
  trained = options.attention_block(saved['model']['attention']).to_dict()
  config = cli.override_config(_with_attention(saved, trained), overrides)
  now = config.model.attention.to_dict()
  changed = {k: (trained[k], v) for k, v in now.items() if trained[k] != v}
  if not changed:
    return config, changed
  before = _shapes(_with_attention(saved, trained), task)
  after = _shapes(config, task)
  if before == after:
    return config, changed
  culprits = []
  for key, (_, value) in changed.items():
    single = _with_attention(saved, {**trained, key: value})
    change = _shape_change(before, _shapes(single, task))
    if change:
      culprits = [(key, value, change)]
      break
  if not culprits:  # only together
    change = _shape_change(before, after)
    culprits = [(k, v, change) for k, (_, v) in changed.items()]
  flags_text = ' '.join(
    f'--config.model.attention.{k}={registry.shown(v)}' for k, v, _ in culprits
  )
  raise UserError(
    f'{flags_text} changes the shapes of the trained parameters '
    f'({culprits[0][2]}), so the checkpoint cannot be evaluated with it; '
    'change only options that keep them, or train a run with it.'
  )


def options_suffix(changed):
  """'_num_hashes8' for {'num_hashes': (1, 8)}: the eval file's name part."""
  from models.attention import registry  # pylint: disable=g-import-not-at-top

  parts = [
    re.sub(r'[^A-Za-z0-9._]+', '-', f'{k}{registry.shown(v)}').strip('-')
    for k, (_, v) in sorted(changed.items())
  ]
  return ''.join(f'_{p}' for p in parts)


def output_name(split, which, step, step_given):
  """eval_<split>_best.json, eval_<split>_latest.json or
  eval_<split>_step<N>.json: one file per thing evaluated."""
  if step_given:
    return f'eval_{split}_step{step}.json'
  return f'eval_{split}_{which}.json'


def evaluate_checkpoint(
  workdir,
  split,
  step=None,
  which='best',
  max_length=None,
  data_dir=None,
  overrides=(),
):
  """Evaluates one checkpoint (lra.load_run); overrides:
  --config.model.attention.* flags (with_eval_options). Returns the
  metrics written to the workdir's eval file (result['file'])."""
  config = load_config(workdir, data_dir)
  if max_length is not None and max_length < 1:
    raise UserError(
      f'--max_length={max_length} is out of range: it must be an integer '
      f'>= 1, e.g. --max_length={config.max_length}.'
    )
  task = tasks.get_task(config.task)
  changed = {}
  if overrides:
    config, changed = with_eval_options(config, task, overrides)
  shardings = runtime.make_mesh()
  run = load_run(workdir, which, step, config=config, shardings=shardings)
  if max_length:
    run = run.at_length(max_length, shardings[0])
  result = run.evaluate(split, progress=True)
  result.update(step=run.step, split=split, checkpoint=run.which)
  result['file'] = output_name(split, run.which, run.step, step is not None)
  if max_length:
    result['max_length'] = max_length
    result['file'] = result['file'][: -len('.json')] + f'_len{max_length}.json'
  if changed:
    result['eval_options'] = {k: v for k, (_, v) in changed.items()}
    result['trained_options'] = {k: v for k, (v, _) in changed.items()}
    result['file'] = result['file'][: -len('.json')] + (
      f'{options_suffix(changed)}.json'
    )
  if processes.is_primary():
    try:
      write_json(os.path.join(workdir, result['file']), result)
    except OSError as e:  # printed first by main, then this sentence
      result['write_error'] = (
        f'could not write {os.path.join(workdir, result["file"])} '
        f'({e.strerror}); the numbers above are not saved: copy them, or '
        'make the run directory writable and run the same command again.'
      )
  return result


def main(argv):
  f = flags.FLAGS
  cli.quiet_logs()
  try:
    if stray := cli.stray_argument(argv):
      raise stray
    if _OVERRIDES and not f.workdir:
      raise UserError(
        f'{_OVERRIDES[0].split("=", 1)[0]} needs --workdir DIR, the run to '
        'evaluate with it.'
      )
    if f.plot:
      try:
        written, _ = curves.plot(f.plot, f.plot_dir)
      except OSError as e:
        raise UserError(
          f'Could not write the plots ({e.strerror}: {e.filename}); give a '
          'writable folder with --plot_dir DIR.'
        ) from None
      print('wrote ' + ', '.join(written))
    elif f.table:
      print(tables(f.table))
      if f.bench:
        print(f'wrote {bubble_chart(f.table, f.bench)}')
    elif f.bench:
      raise UserError(
        '--bench needs --table RUNS_DIR, the runs whose accuracy it plots.'
      )
    elif f.workdir:
      cli.initialize_processes()
      r = evaluate_checkpoint(
        f.workdir,
        f.split,
        f.step,
        f.which,
        f.max_length,
        f.data_dir,
        _OVERRIDES,
      )
      if processes.is_primary():
        lm = 'token_accuracy' in r  # an LM objective (lra/train/objectives.py)
        score = (
          f'token accuracy {r["token_accuracy"]:.4f}'
          if lm
          else f'accuracy {r["accuracy"]:.4f}'
        )
        wrote = (
          ''
          if 'write_error' in r
          else f'; wrote {os.path.join(f.workdir, r["file"])}'
        )
        print(
          f'{r["split"]} at step {r["step"]} ({r["checkpoint"]}): {score}, '
          f'loss {r["loss"]:.4f} over {r["count"]} '
          f'{"positions" if lm else "examples"}{wrote}'
        )
        if 'write_error' in r:
          raise UserError(r['write_error'][0].upper() + r['write_error'][1:])
    else:
      raise UserError(
        'Give --workdir DIR to evaluate a run, --table RUNS_DIR for the '
        'accuracy table or --plot RUNS for the training curves.'
      )
  except UserError as e:
    cli.exit_with_error(e)


# The --config.model.attention.* flags, kept apart by parse_flags.
_OVERRIDES = []


def parse_flags(argv):
  """cli.parse_flags, with the --config.* overrides set aside for
  evaluate_checkpoint (the config is the run's config.json)."""
  rest, overrides = cli.split_overrides(argv)
  _OVERRIDES[:] = overrides
  return cli.parse_flags(rest)


def run():
  """The command line: eval.py, `python -m lra.report.eval_main`, lra-eval."""
  define_flags()
  cli.run_main(main, parse_flags, usage=__doc__)


if __name__ == '__main__':
  run()
