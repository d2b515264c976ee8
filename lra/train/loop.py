"""One training run, top to bottom: restore or init, then a batch and a step
at a time, then "is it time to log / evaluate / save / stop", then the test.

train_and_evaluate (below) is the loop; its pieces are named functions here
(restore_or_init, open_log, prefetched, the Trainer's evaluate, finish).
The config is checked here, before anything is built or written
(lra/train/config.py check), then trusted.
"""

import contextlib
import dataclasses
import errno
import json
import math
import os
import shutil
import signal
import sys
import threading
import time
from typing import Callable

from flax import nnx
import jax
from ml_collections import ConfigDict
import numpy as np

from lra import commands
from lra import data as tasks
from lra.errors import NON_FINITE_STOP, UserError
from lra.train import (
  batching,
  curriculum,
  objectives,
  processes,
  rundir,
  runtime,
  steps,
  validate,
)
from lra.train import config as config_loader
from lra.train.build import at_length, create_state, init_from
from lra.train.checkpoints import CheckpointError, Checkpoints, saved_steps
from lra.train.lock import workdir_lock
from lra.train.metrics import MetricsLog, TensorBoard, selection
from lra.train.oom import out_of_memory
from lra.train.prefetch import Prefetcher
from lra.train.progress import NonFiniteLoss, Progress

# The best-on-validation record before any evaluation.
NO_BEST = {'step': None, 'accuracy': -1.0, 'val': None}


def warn(message: str) -> None:
  if processes.is_primary():
    print(f'warning: {message}', file=sys.stderr, flush=True)


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
      warn(f'{e.what}; moved it to {moved}.')
  warn(
    f'the best checkpoint (step {best["step"]}) is gone; the best is chosen '
    'again from the next evaluations.'
  )
  return no_best


def check_inputs(config: ConfigDict, workdir: str) -> str:
  """Everything the user can get wrong, checked before the workdir exists;
  returns the model selection (lra/train/metrics.py)."""
  config_loader.check(config)
  select = selection(config)
  validate.check_dir(workdir, '--workdir')
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


def training_batch(
  config: ConfigDict, task: tasks.Task, data: dict, stages: list, step: int
) -> dict[str, np.ndarray]:
  """The host's rows of the batch of 0-based `step`: a stateless draw of
  (seed, step) (lra/train/batching.py), cropped by the length curriculum
  (Shortformer's: a crop of the same rows) and turned into an LM
  objective's batch (masked_lm: the documents, masked in the step)."""
  return training_batches(config, task, data, stages)(step)


def random_batch(config, task, seed=0):
  """The host batch of a training step of `config`, on random data: random
  tokens (ids 1..vocab-1, so nothing is padding) and labels of the task's
  shapes, through loop.training_batch (an LM objective's inputs, targets
  and masks). No length curriculum: the cell is the full length."""
  rng = np.random.default_rng(seed)
  b, length = config.batch_size, config.max_length
  options = config.data.to_dict()
  vocab = task.vocab_size_for(options)
  docs = (task.num_inputs,) if task.num_inputs > 1 else ()
  inputs = rng.integers(1, vocab, (b, *docs, length), dtype=np.int32)
  if task.per_position:
    labels = rng.integers(0, vocab, (b, length), dtype=np.int32)
  else:
    labels = rng.integers(0, task.num_classes, (b,), dtype=np.int32)
  return training_batch(config, task, {'train': (inputs, labels)}, [], 0)


def training_batches(
  config: ConfigDict, task: tasks.Task, data: dict, stages: list
) -> Callable[[int], dict[str, np.ndarray]]:
  """training_batch(config, task, data, stages, step) as a function of the
  step alone, the config's values read once (the loop draws a batch a
  step: a ConfigDict lookup costs about 0.6 us)."""
  index, count = jax.process_index(), jax.process_count()
  seed, batch_size = config.seed, config.batch_size
  max_length = config.max_length
  rows = batching.host_slice(batch_size, index, count)
  lm = objectives.is_lm(config)
  if stages:
    pad_id = 0 if config.data.get('black_is_padding') else task.pad_id
  inputs, labels = data['train']

  def make(step):
    batch = batching.train_batch(
      inputs,
      labels,
      seed=seed,
      step=step,
      global_batch=batch_size,
      length=max_length,
      process_index=index,
      process_count=count,
    )
    if stages:
      batch['inputs'] = curriculum.crop(
        batch['inputs'],
        curriculum.length_at(stages, step + 1, max_length),
        windows=lm,
        seed=seed,
        step=step,
        pad_id=pad_id,
        rows=rows,
        global_rows=batch_size,
      )
    if lm:  # masked_lm: plain tokens, masked in the step (objectives.in_step)
      batch = objectives.lm_batch(batch, config, task)
    return batch

  return make


# Signals that ask the loop to stop at the end of its step and save: Ctrl-C,
# and SIGTERM (preemption: TPU/cloud VMs, Slurm, Kubernetes end runs so).
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def stop_requests():
  """A list that gets the signal's number when Ctrl-C or SIGTERM asks to
  stop: the loop then ends at the end of its current step, saves (the
  checkpoint there resumes exactly) and exits; a second Ctrl-C interrupts
  at once (exit 130, no traceback). Signal handlers can only be set in
  the main thread; elsewhere
  the list stays empty."""
  requested = []

  def request_stop(signum, frame):
    del frame
    requested.append(signum)
    if signum == signal.SIGINT:
      signal.signal(signal.SIGINT, stop_now)

  def stop_now(signum, frame):
    # A second Ctrl-C: stop at once, without a traceback. A save in flight
    # is written to a temporary folder first, so the previous checkpoint
    # stays whole; the same command resumes from it.
    del signum, frame
    print(
      '\nStopped at once (a second Ctrl-C); the latest complete checkpoint '
      'is kept: run the same command to resume.',
      file=sys.stderr,
      flush=True,
    )
    os._exit(130)  # pylint: disable=protected-access

  if threading.current_thread() is not threading.main_thread():
    yield requested
    return
  previous = {s: signal.signal(s, request_stop) for s in STOP_SIGNALS}
  try:
    yield requested
  finally:
    for s, handler in previous.items():
      signal.signal(s, handler)


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


def prefetched(
  config: ConfigDict,
  task: tasks.Task,
  data: dict,
  stages: list,
  batch_sharding,
  start: int,
) -> Prefetcher:
  """(step, batch) for the steps after `start`, made prefetch_depth(config)
  steps ahead on a worker thread (lra/train/prefetch.py) and transferred there,
  one transfer per batch; depth 0: made in the loop's thread, host arrays
  that the step's dispatch places (one process; several: placed here).
  The step's key is drawn inside the step (lra.train.steps.step_key:
  fold_in(fold_in(key(seed), 1), s))."""
  depth = prefetch_depth(config)
  on_host = depth == 0 and jax.process_count() == 1

  make = training_batches(config, task, data, stages)

  def prepared(step):
    batch = make(step - 1)
    return batch if on_host else runtime.to_device(batch, batch_sharding)

  steps_left = range(start + 1, config.num_train_steps + 1)
  return Prefetcher(prepared, steps_left, depth)


def prefetch_depth(config: ConfigDict) -> int:
  """config.prefetch, with -1 (the default): 0 on a CPU, 2 on an
  accelerator. On a CPU the loop's own thread is faster (measured in
  docs/benchmark.md: a worker thread contends with the step's dispatch for
  Python's lock); on a GPU/TPU the worker keeps the next two batches
  transferred while the device computes."""
  depth = config.get('prefetch', -1)
  if depth < 0:
    return 0 if jax.default_backend() == 'cpu' else 2
  return depth


def exit_interrupted(last_good: int, preempted: bool) -> None:
  """Says where the latest checkpoint is and exits 130 (Ctrl-C) or 143
  (SIGTERM: preempted)."""
  where = f'step {last_good}' if last_good else 'no checkpoint yet'
  print(
    f'{"Preempted (SIGTERM)" if preempted else "Interrupted"}; latest '
    f'checkpoint: {where}. Run the same command to resume.',
    file=sys.stderr,
  )
  sys.exit(143 if preempted else 130)


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
        warn(f'test split {name} not evaluated: {e}')
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


def finished_results(workdir: str, start: int, config: ConfigDict):
  """results.json's contents when the run already trained all its steps,
  else None."""
  path = os.path.join(workdir, 'results.json')
  if start >= config.num_train_steps and os.path.exists(path):
    if processes.is_primary():
      print(f'{workdir} already finished {start} steps; see results.json.')
    with open(path) as f:
      return json.load(f)
  return None


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
) -> dict:
  """Trains, validates and tests one run in `workdir` (resuming it when it
  has checkpoints); returns results.json's contents. on_step(step, ckpt),
  when given, is called after each step (tests: a kill at a chosen step)."""
  select = check_inputs(config, workdir)
  t, changes = make_trainer(config, workdir)
  fresh = not os.path.exists(workdir)
  with workdir_lock(workdir, processes.is_primary()):
    try:
      return run(t, workdir, select, changes, on_step)
    except Exception as e:  # pylint: disable=broad-except
      if not out_of_memory(e):
        raise
      if fresh and not any(saved_steps(workdir).values()):
        shutil.rmtree(workdir, ignore_errors=True)  # nothing of it is kept
      raise memory_error(config) from None


def memory_error(config: ConfigDict) -> UserError:
  """The one sentence for a step that does not fit in memory."""
  return UserError(
    f'The model does not fit in memory at batch_size {config.batch_size} '
    f'and max_length {config.max_length}; lower --config.batch_size (with '
    '--config.grad_accum_steps to keep the effective batch), '
    '--config.max_length, or set --config.model.remat=True.'
  )


def run(t, workdir, select, changes, on_step):
  """The run of train_and_evaluate, under the workdir's lock."""
  config = t.config
  # --------------------------------------------------------------- restore
  start, state, best, init_step, changes, ckpt = restore_or_init(
    config, workdir, t.state, changes
  )
  log = open_log(config, workdir, start, init_step, changes)
  done = finished_results(workdir, start, config)
  if done is not None:
    log.close()
    return done

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
  # Read once: a ConfigDict lookup costs about 0.6 us, several a step.
  log_every, eval_every = config.log_every_steps, config.eval_every_steps
  save_every, num_steps = config.checkpoint_every_steps, config.num_train_steps
  batches = prefetched(
    config, t.task, t.data, t.stages, t.batch_sharding, start
  )
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
  except KeyboardInterrupt:
    close_all(progress, log, ckpt)
    exit_interrupted(last_good, signal.SIGTERM in stop_requested)
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
  tested, best = test_best_and_last(t, state, best, start, last_good, ckpt, log)
  return finish(config, workdir, t.task, log, select, best, tested)


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
