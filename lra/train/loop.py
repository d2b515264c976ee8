"""One training run, top to bottom: restore or init, then a batch and a step
at a time, then "is it time to log / evaluate / save / stop", then the test.

train_and_evaluate (below) is the loop; its pieces are named functions here
(restore_or_init, open_log, the Trainer's evaluate; the batches made ahead
in lra/train/prefetch.py, the test and results.json in
lra/train/results.py).
The config is checked here, before anything is built or written
(lra/train/config.py check), then trusted.
"""

import dataclasses
import errno
import math
import os
import shutil
import signal
import time
from typing import Callable

from flax import nnx
import jax
from ml_collections import ConfigDict

from lra import data as tasks
from lra.errors import NON_FINITE_STOP, UserError
from lra.train import config as config_loader
from lra.train import (
  curriculum,
  objectives,
  prefetch,
  processes,
  results,
  rundir,
  runtime,
  steps,
  validate,
)
from lra.train.build import create_state, init_from
from lra.train.checkpoints import CheckpointError, Checkpoints, saved_steps
from lra.train.lock import workdir_lock
from lra.train.metrics import MetricsLog, selection
from lra.train.oom import out_of_memory
from lra.train.progress import NonFiniteLoss, Progress
from lra.train.stops import (
  Stopped,
  exit_interrupted,
  exit_stopped,
  stop_anywhere,
  stop_requests,
)

# The best-on-validation record before any evaluation.
NO_BEST = {'step': None, 'accuracy': -1.0, 'val': None}


def resume_state(
  ckpt: Checkpoints, state: nnx.State
) -> tuple[int, nnx.State, dict]:
  """(step, state, best) from the newest readable checkpoint: a corrupt or
  partial save is moved to checkpoints/unreadable/ with a warning and the
  next older one (latest, then best) is tried; (0, state, no best) when none
  is readable. The best checkpoint is checked too (the test runs on it): if
  it is unreadable the best is chosen again from the evaluations to come."""
  no_best = dict(NO_BEST)
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
      processes.warn(f'{e.what}; skipped it (moved to {moved}).')
      continue
    best = meta['best']
    if not (which == 'best' and best['step'] == step):
      best = check_best(ckpt, state, best, no_best, step)
    if candidates[0] != (step, which):
      processes.warn(
        f'resuming from the {which} checkpoint at step {step} instead.'
      )
    return step, restored, best
  if candidates:
    processes.warn(
      'no checkpoint was readable; training starts again from step 0.'
    )
  return 0, state, no_best


def check_best(
  ckpt: Checkpoints, state: nnx.State, best: dict, no_best: dict, start: int
) -> dict:
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
      processes.warn(f'{e.what}; moved it to {moved}.')
  processes.warn(
    f'the best checkpoint (step {best["step"]}) is gone; the best is chosen '
    'again from the next evaluations.'
  )
  return no_best


def check_inputs(
  config: ConfigDict, workdir: str, allow_foreign: bool = False
) -> str:
  """Everything the user can get wrong, checked before the workdir exists
  (a folder of someone else's files too, unless `allow_foreign`:
  rundir.check_not_foreign); returns the model selection
  (lra/train/metrics.py)."""
  config_loader.check(config)
  select = selection(config)
  validate.check_dir(workdir, '--workdir')
  if not allow_foreign:
    rundir.check_not_foreign(workdir)
  if config.data_dir:
    validate.check_dir(config.data_dir, '--config.data_dir', writable=False)
  else:
    validate.check_dir(tasks.default_data_dir(), 'LRA_DATA_DIR', False)
  return select


def restore_or_init(
  config: ConfigDict, workdir: str, state: nnx.State, changes: dict
) -> tuple[int, nnx.State, dict, int | None, dict, Checkpoints]:
  """(start, state, best, init_step, changes, ckpt): the newest readable
  checkpoint of `workdir`, or step 0 with config.init_from's encoder (a
  fresh run reads init_from before the workdir exists, so a bad one is one
  sentence and nothing is created; a resumed run has its own parameters).
  `changes` (rundir.check_resume) stand only when the run resumes."""
  resuming = any(saved_steps(workdir).values())
  init_step = None
  if not resuming:
    state, init_step = init_from(config, state)
  os.makedirs(workdir, exist_ok=True)
  ckpt = Checkpoints(workdir, keep=config.keep_checkpoints)
  start, best = 0, dict(NO_BEST)
  if resuming:
    start, state, best = resume_state(ckpt, state)
  if start == 0 and init_step is None:  # no checkpoint was readable
    state, init_step = init_from(config, state)
  return start, state, best, init_step, changes if start else {}, ckpt


def open_log(
  config: ConfigDict,
  workdir: str,
  start: int,
  init_step: int | None,
  changes: dict,
) -> MetricsLog:
  """config.json and the metrics.jsonl log of a starting or resumed run,
  with its 'config' rows (init_from, resume changes) and their messages.
  Every process has read the workdir by now; from here on process 0 alone
  writes config.json, metrics.jsonl, results.json and the progress bar
  (all of them write the checkpoints, lra/train/checkpoints.py)."""
  processes.barrier('train:read')
  primary = processes.is_primary()
  say = print if primary else (lambda *a, **k: None)
  if primary:
    rundir.write_config(config, workdir, bool(start), changes, start)
  if start:
    say(f'Resuming {workdir} from step {start}.')
  log = MetricsLog(workdir, resume_step=start or None, primary=primary)
  if init_step is not None:
    log.write(
      0,
      'config',
      init_from=os.path.abspath(config.init_from),
      init_from_checkpoint=config.init_from_checkpoint,
      init_from_step=init_step,
    )
    say(
      f'Encoder from {config.init_from} ({config.init_from_checkpoint} '
      f'checkpoint, step {init_step}); heads and optimizer fresh.'
    )
  if changes:
    log.write(start, 'config', changes={k: list(v) for k, v in changes.items()})
    say(
      'Resuming with changed optimiser settings: '
      + ', '.join(f'{k} {a} -> {b}' for k, (a, b) in changes.items())
      + ' (recorded in config.json).'
    )
  return log


def save_due(config: ConfigDict, last_save_s: float) -> bool:
  """Whether wall time asks for a checkpoint now
  (config.checkpoint_every_minutes; 0: steps only). The loop asks at log
  steps only; process 0 decides for all of them in a multi-process run (a
  save is collective: every process must save the same step)."""
  minutes = config.get('checkpoint_every_minutes', 0)
  if not minutes:
    return False
  due = time.monotonic() - last_save_s >= 60 * minutes
  return processes.agree(due)


def non_finite_error(
  e: NonFiniteLoss, config: ConfigDict, workdir: str, last_good: int
) -> UserError:
  """The one sentence for a NonFiniteLoss: where the last good checkpoint
  is and the command that resumes from it with a lower learning rate."""
  lower = f'{config.learning_rate / 10:g}'
  kept = (
    f'the last good checkpoint is step {last_good} in {workdir}/checkpoints;'
    ' run the same command with a lower --config.learning_rate (e.g. '
    f'{lower}) or --config.grad_clip_norm=1 to resume from it'
    if last_good
    else 'no checkpoint had been saved yet; run the same command with a '
    f'lower --config.learning_rate (e.g. {lower}) or '
    '--config.grad_clip_norm=1 to start again'
  )
  return UserError(f'{NON_FINITE_STOP}{e.args[1]} at step {e.args[0]}; {kept}.')


# ------------------------------------------------------------------ the run
@dataclasses.dataclass
class Trainer:
  """What one run is made of, built once by make_trainer: the task, the
  mesh's shardings, the model's graphdef and fresh state, the jitted steps,
  the data and the length curriculum's stages."""

  config: ConfigDict
  task: tasks.Task
  replicated: object
  batch_sharding: object
  graphdef: nnx.GraphDef
  state: nnx.State
  train_step: Callable
  eval_step: Callable
  data: dict
  stages: list

  def evaluate(self, state: nnx.State, split: str) -> dict:
    """Exact metrics of `state` on a whole split (runtime.evaluate)."""
    return runtime.evaluate(
      self.eval_step,
      state,
      self.data[split],
      self.config,
      self.batch_sharding,
      desc=split,
    )


def make_trainer(config: ConfigDict, workdir: str) -> tuple[Trainer, dict]:
  """(the run's Trainer, the optimiser changes of a resumed run): mesh,
  model, a resumed run's config checked against its config.json
  (rundir.check_resume, before the data is read), data and steps."""
  task = tasks.get_task(config.task)
  replicated, batch_sharding = runtime.make_mesh()
  graphdef, state = create_state(config, task, replicated)
  changes = rundir.check_resume(
    config, workdir, config_loader.predated_defaults(config)
  )
  stages = curriculum.parse(config.length_schedule, config.max_length)
  data = runtime.load_data(config, task)
  prepare = objectives.in_step(config, task)  # masked_lm's masks, in jit
  train_step = steps.make_train_step(
    graphdef,
    prepare,
    config.seed,
    # Host batches are placed by the step's dispatch (prefetched): one
    # process only, where the host's rows are the global batch.
    (replicated, batch_sharding) if jax.process_count() == 1 else None,
    # One packed metrics row a step, with the learning rate applied.
    packed_lr=(steps.learning_rate_schedule(config), config.grad_accum_steps),
  )
  eval_step = steps.make_eval_step(graphdef, prepare)
  trainer = Trainer(
    config, task, replicated, batch_sharding, graphdef, state,
    train_step, eval_step, data, stages,
  )  # fmt: skip
  return trainer, changes


def compiles_at(t: Trainer, step: int, start: int) -> bool:
  """Whether `step` compiles the train step (the first one, and each
  change of length under the curriculum)."""
  if step == start + 1:
    return True
  length_at, stages = curriculum.length_at, t.stages
  max_length = t.config.max_length
  return bool(stages) and length_at(stages, step, max_length) != length_at(
    stages, step - 1, max_length
  )


def validate_and_keep_best(t, state, step, best, log, progress, ckpt):
  """Evaluates `state` on validation at `step`, logs it, and saves it as
  the best checkpoint when it is better; returns the best record."""
  progress.flush()
  val = t.evaluate(state, 'val')
  if not math.isfinite(val['loss']):  # never kept, never selected
    raise NonFiniteLoss(step, 'the validation loss is not finite')
  log.write(step, 'val', **val)
  progress.write(f'step {step}: val {objectives.describe(val, t.config)}')
  if objectives.better(val, best, t.config):
    acc_key = objectives.accuracy_key(t.config)
    best = {'step': step, 'accuracy': val[acc_key], 'val': val}
    ckpt.save('best', step, state, {'step': step, 'best': best})
  progress.resume_timer(step)  # steps/s counts training steps only
  return best


def close_all(progress, log, ckpt, quiet=False):
  """Closes the progress bar, metrics.jsonl and the checkpoint managers
  (which wait for the last save to be written); quiet: after an error,
  a failing close (a full disk) raises nothing more."""
  for close in (progress.close, log.close):
    try:
      close()
    except OSError:
      if not quiet:
        raise
  ckpt.close(quiet=quiet)


def write_failed(e: OSError, workdir: str, last_good: int) -> UserError:
  """The one sentence for a write that failed (metrics, TensorBoard)."""
  why = 'no space left on device' if e.errno == errno.ENOSPC else e.strerror
  kept = f'step {last_good}' if last_good else 'none yet'
  return UserError(
    f"Writing the run's logs in {workdir} failed ({why}); the last "
    f'checkpoint ({kept}) is intact: free some space (or fix the cause) '
    'and run the same command to resume.'
  )


def train_and_evaluate(
  config: ConfigDict,
  workdir: str,
  on_step: Callable[[int, Checkpoints], None] | None = None,
  allow_foreign_workdir: bool = False,
) -> dict:
  """Trains, validates and tests one run in `workdir` (resuming it when it
  has checkpoints); returns results.json's contents. on_step(step, ckpt),
  when given, is called after each step (tests: a kill at a chosen step).
  allow_foreign_workdir: train in a folder that holds other files
  (--allow_foreign_workdir; refused otherwise)."""
  stage = ['while starting']  # what a stop signal interrupts (its line)
  try:
    with stop_anywhere():
      return _train_and_evaluate(
        config, workdir, on_step, allow_foreign_workdir, stage
      )
  except Stopped as e:
    exit_stopped(e.signum, workdir, stage[0])


def _train_and_evaluate(config, workdir, on_step, allow_foreign, stage):
  """train_and_evaluate's body, under stop_anywhere; `stage` (a one-item
  list) names the part running, for a stop signal's line."""
  select = check_inputs(config, workdir, allow_foreign)
  t, changes = make_trainer(config, workdir)
  fresh = not os.path.exists(workdir)
  try:
    with workdir_lock(workdir, processes.is_primary()):
      try:
        return run(t, workdir, select, changes, on_step, stage)
      except Exception as e:  # pylint: disable=broad-except
        if not out_of_memory(e):
          raise
        if fresh and not any(saved_steps(workdir).values()):
          shutil.rmtree(workdir, ignore_errors=True)  # nothing of it is kept
        raise memory_error(config) from None
  except OSError as e:  # a write outside the loop's own (the start, the end)
    raise start_failed(e, workdir) from None


def start_failed(e: OSError, workdir: str) -> UserError:
  """The one sentence for a write that failed outside the training loop
  (the lock, config.json, the metrics log, the first checkpoint's folders,
  results.json): every write there goes through a temp file and a rename
  or only adds, so what the workdir held is whole."""
  space = e.errno == errno.ENOSPC
  why = 'no space left on device' if space else (e.strerror or str(e))
  where = f' ({e.filename})' if e.filename else ''
  kept = rundir.latest_step(workdir)
  held = f'its checkpoints (latest: step {kept})' if kept else 'what it held'
  return UserError(
    f'Writing to {workdir} failed{where}: {why}; {held} are intact: '
    f'{"free some disk space" if space else "fix the cause"} and run the '
    'same command to resume.'
  )


def memory_error(config: ConfigDict) -> UserError:
  """The one sentence for a step that does not fit in memory."""
  return UserError(
    f'The model does not fit in memory at batch_size {config.batch_size} '
    f'and max_length {config.max_length}; lower --config.batch_size (with '
    '--config.grad_accum_steps to keep the effective batch), '
    '--config.max_length, or set --config.model.remat=True.'
  )


def run(t, workdir, select, changes, on_step, stage=None):
  """The run of train_and_evaluate, under the workdir's lock; `stage` (a
  one-item list) is set to what runs, for a stop signal's line."""
  stage = [''] if stage is None else stage
  config = t.config
  # --------------------------------------------------------------- restore
  stage[0] = 'while restoring the run'
  start, state, best, init_step, changes, ckpt = restore_or_init(
    config, workdir, t.state, changes
  )
  try:
    log = open_log(config, workdir, start, init_step, changes)
  except Stopped:
    ckpt.close(quiet=True)
    raise
  done = results.finished_results(workdir, start, config)
  if done is not None:
    log.close()
    ckpt.close(quiet=True)
    return done
  try:
    return _loop_and_test(t, workdir, select, on_step, stage, start, state,
                          best, ckpt, log)  # fmt: skip
  except Stopped:  # outside the loop's own handling: the files closed
    log.close()
    ckpt.close(quiet=True)
    raise


def _loop_and_test(t, workdir, select, on_step, stage, start, state, best,
                   ckpt, log):  # fmt: skip
  """The training loop, then the test and results.json (run's body)."""
  config = t.config

  # ------------------------------------------------------------------ loop
  progress = Progress(
    config,
    log,
    start=start,
    stages=t.stages,
    acc_key=objectives.accuracy_key(config),
    primary=processes.is_primary(),
  )
  last_good, last_save_s = start, time.monotonic()
  # Read once: a ConfigDict lookup is a Python call chain, several a step.
  log_every, eval_every = config.log_every_steps, config.eval_every_steps
  save_every, num_steps = config.checkpoint_every_steps, config.num_train_steps
  batches = prefetch.prefetched(
    config, t.task, t.data, t.stages, t.batch_sharding, start
  )
  stage[0] = 'while training'
  stop_requested = []
  try:
    with stop_requests() as stop_requested, batches:
      for step, batch in batches:
        compiles = compiles_at(t, step, start)
        if compiles:  # the held row's steps/s without the compilation
          progress.write_held()
        state, metrics = t.train_step(state, batch)
        progress.step_done(step, metrics, compiles)
        last = step == num_steps
        if step % log_every == 0:
          progress.log_step()  # written after the next step's dispatch
        if step % eval_every == 0 or last:
          best = validate_and_keep_best(
            t, state, step, best, log, progress, ckpt
          )
        stopping = bool(stop_requested)  # read once: a signal may come now
        if (
          step % save_every == 0
          or last
          or stopping
          or (step % log_every == 0 and save_due(config, last_save_s))
        ):
          progress.flush()
          ckpt.save('latest', step, state, {'step': step, 'best': best})
          last_good, last_save_s = step, time.monotonic()
          progress.resume_timer(step)
        if on_step is not None:
          on_step(step, ckpt)
        if stopping:
          raise KeyboardInterrupt
      ckpt.wait()  # the last saves written (a failed one: one sentence)
  except KeyboardInterrupt as e:
    close_all(progress, log, ckpt)
    first = stop_requested[0] if stop_requested else signal.SIGINT
    exit_interrupted(last_good, getattr(e, 'signum', first))
  except NonFiniteLoss as e:
    close_all(progress, log, ckpt)  # the last good save written
    raise non_finite_error(e, config, workdir, last_good) from None
  except UserError:  # a save that failed: its sentence, nothing after it
    close_all(progress, log, ckpt, quiet=True)
    raise
  except OSError as e:  # a log write that failed (a full disk)
    close_all(progress, log, ckpt, quiet=True)
    raise write_failed(e, workdir, last_good) from None
  progress.close()

  # ------------------------------------------------------------------ test
  stage[0] = (
    f'during the final test (training finished at step {last_good}; the '
    'test runs again on resuming)'
  )
  tested, best = results.test_best_and_last(
    t, state, best, start, last_good, ckpt, log
  )
  return results.finish(config, workdir, t.task, log, select, best, tested)
