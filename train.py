r"""Trains an LRA model: one jit-compiled step, data-parallel over all devices.

  python train.py --config configs/listops.py:transformer,small --workdir runs/s
  python train.py --config configs/<task>.py:<model>[,small|,smoke] \
      --workdir DIR [--config.<key>=<value> ...]

The same command with the same workdir resumes from the latest checkpoint and
ends with the same results as an uninterrupted run. Writes config.json,
metrics.jsonl, checkpoints/{latest,best}/ and results.json: `test` measured on
the best-on-validation checkpoint, `test_last` on the final step's, `select`
the one the accuracy table reports (--config.select, lra/metrics.py; not
for an LM objective, whose best checkpoint has the lowest validation loss)
and `data_source` ('generated' or 'release'). steps/s (metrics.jsonl, progress
bar) counts training steps only: not compilation, evaluation or saving.

Bad input (config values, paths, data) stops with one `error:` sentence and
exit status 2 before the workdir is created. An unreadable checkpoint is
moved to checkpoints/unreadable/ with a warning and the run resumes from the
newest readable one. After a non-finite loss (or parameters), run the same
command with a lower --config.learning_rate or a --config.grad_clip_norm: it
resumes from the last good checkpoint and records the change (configs/base.py).

--config.init_from=DIR starts a fresh run from the encoder of DIR's best
(or --config.init_from_checkpoint=latest) checkpoint, heads and optimizer
fresh (lra/pretrained.py; recorded as a metrics.jsonl row of split
'config' at step 0). --config.length_schedule=1000:256,2000:1024 trains
the first steps on shorter crops (lra/curriculum.py; each train row of
metrics.jsonl then records its `length`).
"""

import json
import os
import signal
import sys
import threading

from absl import app, flags, logging
from flax import nnx
import jax
from ml_collections import config_flags
import numpy as np
from tqdm import tqdm

from lra import (
  batching,
  cli,
  curriculum,
  objectives,
  pretrained,
  runtime,
  steps,
  tasks,
  validate,
)
from lra.checkpoints import CheckpointError, Checkpoints, saved_steps
from lra.errors import UserError
from lra.metrics import (
  MetricsLog,
  StepTimer,
  TensorBoard,
  selection,
  write_json,
)
from models.classifier import build_model
from models.embeddings import fit_for_fine_tune


class NonFiniteLoss(Exception):
  pass


# ---------------------------------------------------------------- model
def create_state(config, task, replicated):
  """Model + optimizer -> (graphdef, replicated state)."""
  model = build_model(config, task)
  optimizer = nnx.Optimizer(model, steps.make_optimizer(config), wrt=nnx.Param)
  graphdef, state = nnx.split((model, optimizer))
  return graphdef, jax.device_put(state, replicated)


def init_from(config, state):
  """(state whose encoder is config.init_from's, the step read), or
  (state, None) without init_from (lra/pretrained.py). The learned position
  table is extended by copying (Longformer) when this run is longer (the
  CLS row stays first); a language model's extra token row (its mask id)
  is dropped (models.embeddings.fit_for_fine_tune)."""
  if not config.init_from:
    return state, None
  keep = int(config.model.pooling == 'cls')
  return pretrained.load_encoder(
    state,
    config.init_from,
    config.init_from_checkpoint,
    resize=lambda path, a, shape: fit_for_fine_tune(path, a, shape, keep),
  )


def at_length(config, task, replicated, state, max_length):
  """(graphdef, state) of the same model built for `max_length`, with the
  parameters of `state` (eval.py --max_length): a learned position table is
  extended by copying its rows (Longformer); the optimizer state is fresh."""
  longer = config.copy_and_resolve_references()
  with longer.unlocked():
    longer.max_length = max_length
  graphdef, fresh = create_state(longer, task, replicated)
  keep = int(config.model.pooling == 'cls')
  return graphdef, pretrained.transplant(
    state,
    fresh,
    resize=lambda path, a, shape: fit_for_fine_tune(path, a, shape, keep),
    length=max_length,
  )


# ----------------------------------------------------------------- loop
def warn(message):
  if runtime.is_primary():
    print(f'warning: {message}', file=sys.stderr, flush=True)


def resume_state(ckpt, state):
  """(step, state, best) from the newest readable checkpoint: a corrupt or
  partial save is moved to checkpoints/unreadable/ with a warning and the
  next older one (latest, then best) is tried; (0, state, no best) when none
  is readable. The best checkpoint is checked too (the test runs on it): if
  it is unreadable the best is chosen again from the evaluations to come."""
  no_best = {'step': None, 'accuracy': -1.0, 'val': None}
  candidates = sorted(
    [(s, w) for w in ('latest', 'best') for s in ckpt.all_steps(w)],
    key=lambda c: (c[0], c[1] == 'latest'),
    reverse=True,
  )
  for step, which in candidates:
    try:
      restored, meta = ckpt.restore(which, step, state)
    except CheckpointError as e:
      moved = ckpt.set_aside(which, step)
      warn(f'{e.what}; skipped it (moved to {moved}).')
      continue
    best = meta['best']
    if not (which == 'best' and best['step'] == step):
      best = check_best(ckpt, state, best, no_best, step)
    if candidates[0] != (step, which):
      warn(f'resuming from the {which} checkpoint at step {step} instead.')
    return step, restored, best
  if candidates:
    warn('no checkpoint was readable; training starts again from step 0.')
  return 0, state, no_best


def check_best(ckpt, state, best, no_best, start):
  """`best`, or `no_best` with a warning when its checkpoint is unreadable
  or gone."""
  saved = ckpt.all_steps('best')
  if best['step'] is None or any(s > start for s in saved):
    # A later best exists (saved before a kill or a skipped checkpoint):
    # the steps to come reproduce it exactly.
    return best
  if best['step'] in saved:
    try:
      ckpt.restore('best', best['step'], state)
      return best
    except CheckpointError as e:
      moved = ckpt.set_aside('best', best['step'])
      warn(f'{e.what}; moved it to {moved}.')
  warn(
    f'the best checkpoint (step {best["step"]}) is gone; the best is chosen '
    'again from the next evaluations.'
  )
  return no_best


def train_and_evaluate(config, workdir, stop_after=None):
  # Everything the user can get wrong is checked before the workdir exists.
  validate.check_config(config)
  select = selection(config)
  validate.check_dir(workdir, '--workdir')
  if config.data_dir:
    validate.check_dir(config.data_dir, '--config.data_dir', writable=False)
  else:
    validate.check_dir(tasks.default_data_dir(), 'LRA_DATA_DIR', False)
  task = tasks.get_task(config.task)
  replicated, batch_sharding = runtime.make_mesh()
  graphdef, state = create_state(config, task, replicated)
  changes = runtime.check_resume(config, workdir)
  stages = curriculum.parse(config.length_schedule, config.max_length)
  data = runtime.load_data(config, task)
  train_step = steps.make_train_step(graphdef)
  eval_step = steps.make_eval_step(graphdef)

  # ---- restore
  resuming = any(saved_steps(workdir).values())
  # A fresh run reads init_from before the workdir exists (a bad one is
  # one sentence, nothing created); a resumed run has its own parameters.
  init_step = None
  if not resuming:
    state, init_step = init_from(config, state)
  os.makedirs(workdir, exist_ok=True)
  ckpt = Checkpoints(workdir, keep=config.keep_checkpoints)
  start, best = 0, {'step': None, 'accuracy': -1.0, 'val': None}
  if resuming:
    start, state, best = resume_state(ckpt, state)
  resuming = resuming and start > 0
  if not resuming and init_step is None:  # no checkpoint was readable
    state, init_step = init_from(config, state)
  changes = changes if resuming else {}
  # Every process has read the workdir; from here on process 0 alone writes
  # config.json, metrics.jsonl, results.json and the progress bar (all of
  # them write the checkpoints, lra/checkpoints.py).
  runtime.barrier('train:read')
  primary = runtime.is_primary()
  if primary:
    runtime.write_config(config, workdir, resuming, changes, start)
  if start and primary:
    print(f'Resuming {workdir} from step {start}.')
  log = MetricsLog(
    workdir, resume_step=start if start else None, primary=primary
  )
  if init_step is not None:
    log.write(
      0,
      'config',
      init_from=os.path.abspath(config.init_from),
      init_from_checkpoint=config.init_from_checkpoint,
      init_from_step=init_step,
    )
    if primary:
      print(
        f'Encoder from {config.init_from} ({config.init_from_checkpoint} '
        f'checkpoint, step {init_step}); heads and optimizer fresh.'
      )
  if changes:
    log.write(start, 'config', changes={k: list(v) for k, v in changes.items()})
  if changes and primary:
    print(
      'Resuming with changed optimiser settings: '
      + ', '.join(f'{k} {a} -> {b}' for k, (a, b) in changes.items())
      + ' (recorded in config.json).'
    )
  if start >= config.num_train_steps and os.path.exists(
    os.path.join(workdir, 'results.json')
  ):
    if primary:
      print(f'{workdir} already finished {start} steps; see results.json.')
    return json.load(open(os.path.join(workdir, 'results.json')))

  base_key = jax.random.fold_in(jax.random.key(config.seed), 1)
  pending, last_good = [], start
  bar = tqdm(
    total=config.num_train_steps,
    initial=start,
    desc='train',
    disable=not primary,
    dynamic_ncols=True,
    file=sys.stdout,
    # tqdm's own rate and ETA would count compilation and evaluation: ours
    # instead (eta: the steps left at the training steps/s, evaluation not
    # included).
    bar_format='{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}{postfix}]',
  )
  timer = StepTimer()
  schedule = steps.learning_rate_schedule(config)
  accum = max(config.grad_accum_steps, 1)
  lm = objectives.is_lm(config)
  acc_key = objectives.accuracy_key(config)

  def flush(step):
    """Syncs pending step metrics; raises NonFiniteLoss naming the step."""
    nonlocal pending
    rows = jax.device_get(pending)
    pending = []
    for s, m in rows:
      if not np.isfinite(m['loss']):
        raise NonFiniteLoss(s, 'the loss is not finite')
      if not m['params_finite']:
        raise NonFiniteLoss(s, 'the parameters diverged (their norm overflows)')
    if rows:
      rate = timer.rate(step)  # the steps' results are back: they are done
      mean = lambda k: float(np.mean([m[k] for _, m in rows]))  # noqa: E731
      acc = sum(float(m['correct_sum']) for _, m in rows) / sum(
        float(m['count']) for _, m in rows
      )
      # The rate the optimiser applied at this step (its count: the updates
      # before it; one update per grad_accum_steps steps).
      lr = float(schedule((step - 1) // accum))
      shown = {}
      if rate is not None:
        left = (config.num_train_steps - step) / rate
        eta = tqdm.format_interval(left)
        shown = {'steps_per_s': f'{rate:.2f}', 'eta': eta}
      shown = {
        'loss': f'{mean("loss"):.4f}',
        'acc': f'{acc:.3f}',
        'lr': f'{lr:.3g}',
        **shown,
      }
      bar.set_postfix(shown)  # a dict keeps this order (keywords are sorted)
      return log.write(
        step,
        'train',
        loss=mean('loss'),
        **{acc_key: acc},
        grad_norm=mean('grad_norm'),
        learning_rate=lr,
        steps_per_sec=rate,
        # The curriculum's input length at this step (lra/curriculum.py).
        **(
          {'length': curriculum.length_at(stages, step, config.max_length)}
          if stages
          else {}
        ),
      )

  def save(step):
    ckpt.save('latest', step, state, {'step': step, 'best': best})

  # Ctrl-C asks to stop at the end of the current step (a checkpoint there
  # resumes exactly); a second Ctrl-C interrupts at once.
  stop_requested = []

  def request_stop(signum, frame):
    del signum, frame
    stop_requested.append(True)
    signal.signal(signal.SIGINT, signal.default_int_handler)

  main_thread = threading.current_thread() is threading.main_thread()
  if main_thread:  # signal handlers can only be set there
    previous_handler = signal.signal(signal.SIGINT, request_stop)
  try:
    for step in range(start + 1, config.num_train_steps + 1):
      batch = batching.train_batch(
        *data['train'],
        seed=config.seed,
        step=step - 1,
        global_batch=config.batch_size,
        length=config.max_length,
        process_index=jax.process_index(),
        process_count=jax.process_count(),
      )
      length = curriculum.length_at(stages, step, config.max_length)
      new_stage = length != curriculum.length_at(
        stages, step - 1, config.max_length
      )
      if stages:  # Shortformer's curriculum: a crop of the same rows
        batch['inputs'] = curriculum.crop(
          batch['inputs'],
          length,
          windows=lm,
          seed=config.seed,
          step=step - 1,
          pad_id=0 if config.data.get('black_is_padding') else task.pad_id,
          rows=batching.host_slice(
            config.batch_size, jax.process_index(), jax.process_count()
          ),
          global_rows=config.batch_size,
        )
      if lm:  # the objective's inputs, targets and weights (masks: step)
        batch = objectives.lm_batch(
          batch,
          config,
          task,
          stream='train',
          index=step - 1,
          rows=batching.host_slice(
            config.batch_size, jax.process_index(), jax.process_count()
          ),
          global_batch=config.batch_size,
        )
      state, metrics = train_step(
        state,
        runtime.to_device(batch, batch_sharding),
        jax.random.fold_in(base_key, step),
      )
      pending.append((step, metrics))
      bar.update(1)
      if step == start + 1 or new_stage:  # it compiled: time from its end
        jax.block_until_ready(metrics)
        timer.resume(step)
      last = step == config.num_train_steps
      if step % config.log_every_steps == 0 or last:
        flush(step)
      if step % config.eval_every_steps == 0 or last:
        flush(step)
        val = runtime.evaluate(
          eval_step, state, data['val'], config, batch_sharding, desc='val'
        )
        log.write(step, 'val', **val)
        if primary:
          tqdm.write(f'step {step}: val {objectives.describe(val, config)}')
        if objectives.better(val, best, config):
          best = {'step': step, 'accuracy': val[acc_key], 'val': val}
          ckpt.save('best', step, state, {'step': step, 'best': best})
        timer.resume(step)  # steps/s counts training steps only
      if step % config.checkpoint_every_steps == 0 or last:
        flush(step)
        save(step)
        last_good = step
        timer.resume(step)
      if stop_after is not None and step >= stop_after:
        bar.close()
        os._exit(3)  # pylint: disable=protected-access
      if stop_requested:
        flush(step)
        save(step)
        last_good = step
        raise KeyboardInterrupt
  except KeyboardInterrupt:
    bar.close()
    ckpt.close()
    where = f'step {last_good}' if last_good else 'no checkpoint yet'
    print(
      f'Interrupted; latest checkpoint: {where}. Run the same command to '
      'resume.',
      file=sys.stderr,
    )
    sys.exit(130)
  except NonFiniteLoss as e:
    bar.close()
    kept = (
      f'the last good checkpoint is step {last_good} in {workdir}/checkpoints;'
      ' run the same command with a lower --config.learning_rate (e.g. '
      f'{config.learning_rate / 10:g}) or --config.grad_clip_norm=1 to '
      'resume from it'
      if last_good
      else 'no checkpoint had been saved yet; run the same command with a '
      f'lower --config.learning_rate (e.g. {config.learning_rate / 10:g}) '
      'or --config.grad_clip_norm=1 to start again'
    )
    raise UserError(
      f'Training stopped: {e.args[1]} at step {e.args[0]}; {kept}.'
    ) from None
  finally:
    if main_thread:
      signal.signal(signal.SIGINT, previous_handler)
  bar.close()

  if best['step'] is None:  # its checkpoint was unreadable; take the last
    val = runtime.evaluate(
      eval_step, state, data['val'], config, batch_sharding, desc='val'
    )
    best = {'step': last_good, 'accuracy': val[acc_key], 'val': val}
    ckpt.save('best', last_good, state, {'step': last_good, 'best': best})

  # ---- test the best-on-validation checkpoint and the final step's
  def test_of(test_state):
    return runtime.evaluate(
      eval_step, test_state, data['test'], config, batch_sharding, desc='test'
    )

  best_state, _ = ckpt.restore('best', best['step'], state)
  test = test_of(best_state)
  log.write(best['step'], 'test', checkpoint='best', **test)
  last_step = max(start, config.num_train_steps)
  test_last = test if best['step'] == last_step else test_of(state)
  log.write(last_step, 'test', checkpoint='last', **test_last)
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
    'select': select,  # the one eval.py --table reports (lra/metrics.py)
    'data_source': runtime.data_source(config, task),
  }
  if lm:  # no accuracy to report: best is the lowest validation loss
    del results['select']
  if primary:
    write_json(os.path.join(workdir, 'results.json'), results)
  ckpt.close()
  if primary and lm:
    print(
      f'best step {best["step"]} (lowest val loss): val '
      f'{objectives.describe(best["val"], config)}; test '
      f'{objectives.describe(test, config)}; final step {last_step}: test '
      f'{objectives.describe(test_last, config)}'
    )
  elif primary:
    print(
      f'best step {best["step"]}: val accuracy {best["val"]["accuracy"]:.4f}, '
      f'test accuracy {test["accuracy"]:.4f}; final step {last_step}: test '
      f'accuracy {test_last["accuracy"]:.4f} (reported: {select})'
    )
  if primary:
    print(where_results(workdir, log.tensorboard is not None))
  log.close()
  return results


def where_results(workdir, tensorboard):
  """The final line: where the results, the curves and the TensorBoard
  scalars of a run are."""
  line = (
    f'Results: {os.path.join(workdir, "results.json")}; curves: python '
    f'eval.py --plot {workdir} (writes {workdir}/curves_*.png)'
  )
  if tensorboard:
    board = os.path.join(workdir, TensorBoard.DIR)
    return line + f'; TensorBoard: tensorboard --logdir {board}'
  return line + '; TensorBoard: pip install tensorboardX, then new runs log it'


def quiet_logs():
  """Orbax logs every save at INFO; keep the terminal for the progress bar
  unless the user asked for a verbosity."""
  if not flags.FLAGS['verbosity'].present:
    logging.set_verbosity(logging.WARNING)


def define_flags():
  config_flags.DEFINE_config_file(
    'config', None, 'configs/<task>.py:<model>[,<preset>]', lock_config=True
  )
  flags.DEFINE_string('workdir', None, 'Run directory.')
  cli.define_process_flags()
  flags.DEFINE_integer(
    'stop_after_steps',
    None,
    'Testing: exit abruptly (no save) after this '
    'step, as if the process were killed.',
  )


def main(argv):
  config, workdir = flags.FLAGS.config, flags.FLAGS.workdir
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {" ".join(argv[1:])}')
  if config is None or not workdir:
    print(
      'error: give --config configs/<task>.py:<model> and --workdir DIR.',
      file=sys.stderr,
    )
    sys.exit(2)
  quiet_logs()
  try:
    cli.initialize_processes()
    train_and_evaluate(config, workdir, flags.FLAGS.stop_after_steps)
  except UserError as e:
    cli.exit_with_error(e)


if __name__ == '__main__':
  define_flags()
  app.run(main, flags_parser=cli.parse_flags)
