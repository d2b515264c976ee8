"""The end of a run: the test of the best checkpoint and of the final step
(and of the task's extra test splits), results.json, and the lines that
say where the results are. Called by the loop (lra/train/loop.py run);
results.json's fields are listed in train.py's docstring
(lra/train/main.py) and read by lra/train/rundir.py.
"""

import os

from ml_collections import ConfigDict

from lra import commands
from lra import data as tasks
from lra.errors import UserError
from lra.train import config as config_loader
from lra.train import objectives, processes, rundir, runtime, steps
from lra.train.build import at_length
from lra.train.metrics import TensorBoard


def finished_results(workdir: str, start: int, config: ConfigDict):
  """results.json's contents when the run already trained all its steps,
  else None."""
  path = os.path.join(workdir, 'results.json')
  if start >= config.num_train_steps and os.path.exists(path):
    results = rundir.load_json(
      path,
      what='move it away and run the same command to measure the test '
      'splits again from the checkpoints.',
    )
    if processes.is_primary():
      print(f'{workdir} already finished {start} steps; see results.json.')
    return results
  return None


def test_best_and_last(t, state, best, start, last_good, ckpt, log):
  """(tested, best): the test metrics of the best checkpoint (`test`), of
  the final step (`test_last` at `last_step`) and of the task's extra test
  splits (`test_splits`, best checkpoint), each logged; `best` chosen
  again from the final state when its checkpoint was unreadable."""
  config = t.config
  if best['step'] is None:  # its checkpoint was unreadable; take the last
    val = t.evaluate(state, 'val')
    acc = val[objectives.accuracy_key(config)]
    best = {'step': last_good, 'accuracy': acc, 'val': val}
    ckpt.save('best', last_good, state, {'step': last_good, 'best': best})
  best_state, _ = ckpt.restore('best', best['step'], state)
  test = t.evaluate(best_state, 'test')
  log.write(best['step'], 'test', checkpoint='best', **test)
  last_step = max(start, config.num_train_steps)
  test_last = test if best['step'] == last_step else t.evaluate(state, 'test')
  log.write(last_step, 'test', checkpoint='last', **test_last)
  ckpt.close()
  tested = {'test': test, 'last_step': last_step, 'test_last': test_last}
  tested['test_splits'] = test_splits(
    config, t.task, (t.replicated, t.batch_sharding), t.eval_step, best_state
  )
  for name, metrics in tested['test_splits'].items():
    log.write(best['step'], f'test_{name}', checkpoint='best', **metrics)
  return tested, best


def test_splits(config, task, shardings, eval_step, state):
  """{name: metrics} on the task's extra test splits (lra/data/__init__.py
  extra_test_splits; {} for most tasks). A split no longer than max_length
  is padded to it (padding is masked) and run by this model; a longer one
  by the same model built at its length (at_length: a learned position
  table extended by copying); where that cannot be (a parameter depends on
  the length: Linformer), the split gets {'error': the sentence}."""
  replicated, batch_sharding = shardings
  data_dir = config.data_dir or tasks.default_data_dir()
  splits = task.load_extra_test_splits(data_dir, config.data.to_dict())
  out = {}
  for name, split in splits.items():
    length = split[0].shape[-1]
    run_config, run_step, run_state = config, eval_step, state
    if length > config.max_length:
      try:
        graphdef, run_state = at_length(config, task, replicated, state, length)
      except UserError as e:
        processes.warn(f'test split {name} not evaluated: {e}')
        out[name] = {'error': str(e)}
        continue
      run_step = steps.make_eval_step(
        graphdef, objectives.in_step(config, task)
      )
      run_config = config.copy_and_resolve_references()
      with run_config.unlocked():
        run_config.max_length = length
    out[name] = runtime.evaluate(
      run_step, run_state, split, run_config, batch_sharding, desc=name
    )
  return out


def finish(config, workdir, task, log, select, best, tested):
  """Writes results.json (process 0), prints the summary and where the
  results are; returns the results. tested: the best checkpoint's `test`,
  the final step's `test_last` at `last_step`, and `test_splits` ({name:
  metrics} of the task's extra test splits, best checkpoint; results.json
  has the key only when there are some)."""
  test, test_last = tested['test'], tested['test_last']
  last_step = tested['last_step']
  lm = objectives.is_lm(config)
  results = {
    'task': config.task,
    'model': config.model_name,
    'preset': config.preset,
    # 'classify', or an LM objective: then val/test hold loss,
    # token_accuracy (and perplexity), not classification accuracies.
    'objective': objectives.objective(config),
    'best_step': best['step'],
    'val': best['val'],
    'test': test,
    'last_step': last_step,
    'test_last': test_last,
    'select': select,  # the one eval.py --table reports (lra/train/metrics.py)
    'data_source': runtime.data_source(config, task),
  }
  if lm:  # no accuracy to report: best is the lowest validation loss
    del results['select']
  # The attention options this run changed from its command's config
  # (configs/<task>.py:<model>,<preset>): eval.py --table labels it by them.
  changed = config_loader.changed_from_command(config)
  if changed:
    results[rundir.ATTENTION_OPTIONS_KEY] = changed
  if tested.get('test_splits'):  # the task's extra test splits (mqar)
    results['test_splits'] = tested['test_splits']
  if processes.is_primary():
    rundir.write_results(workdir, results)
    print(summary(config, best, test, last_step, test_last, select))
    for name, metrics in results.get('test_splits', {}).items():
      shown = metrics.get('error') or objectives.describe(metrics, config)
      print(f'test split {name} (best checkpoint): {shown}')
    print(where_results(workdir, log.tensorboard is not None))
  log.close()
  return results


def summary(config, best, test, last_step, test_last, select):
  """The final line of numbers: the best step's validation and test, and
  the final step's test."""
  if objectives.is_lm(config):
    describe = lambda m: objectives.describe(m, config)  # noqa: E731
    return (
      f'best step {best["step"]} (lowest val loss): val '
      f'{describe(best["val"])}; test {describe(test)}; final step '
      f'{last_step}: test {describe(test_last)}'
    )
  return (
    f'best step {best["step"]}: val accuracy {best["val"]["accuracy"]:.4f}, '
    f'test accuracy {test["accuracy"]:.4f}; final step {last_step}: test '
    f'accuracy {test_last["accuracy"]:.4f} (reported: {select})'
  )


def where_results(workdir: str, tensorboard: bool) -> str:
  """The final line: where the results, the curves and the TensorBoard
  scalars of a run are."""
  line = (
    f'Results: {os.path.join(workdir, "results.json")}; curves: '
    f'{commands.command("eval", "--plot", workdir)} (writes '
    f'{os.path.join(workdir, "curves_*.png")})'
  )
  if tensorboard:
    board = os.path.join(workdir, TensorBoard.DIR)
    return line + f'; TensorBoard: tensorboard --logdir {board}'
  return line + '; TensorBoard: pip install tensorboardX, then new runs log it'
