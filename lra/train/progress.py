"""The training loop's reporting: pending step metrics, the progress bar and
the steps/s timer, in one object (train.py's loop calls it, nothing else).

Step metrics stay on the device until a log step. `log_step` holds them;
their row is read and written after the next step is dispatched, so the
device is never drained for it; `flush` (before an evaluation or a save)
reads everything pending at once. Reading stops the run on a non-finite
loss or diverged parameters (NonFiniteLoss naming the step), writes the
metrics.jsonl train row and updates the bar. steps/s counts training steps
only: the timer is resumed after compilation, evaluation and saving.
"""

import sys

import jax
import numpy as np
from tqdm import tqdm

from lra.train import curriculum
from lra.train.metrics import StepTimer
from lra.train.steps import ROW


def fetched(rows):
  """The device's packed metrics rows (lra.train.steps.ROW) -> one numpy array
  [n, len(ROW)]. jax.device_get starts every transfer first, which pays on
  an accelerator; on a CPU, where the arrays already are in host memory,
  reading each is cheaper (device_get of 50 steps' metrics cost 5 ms,
  reading them 0.6 ms, on this project's 2-core CPU)."""
  if jax.default_backend() != 'cpu':
    rows = jax.device_get(rows)
  return np.stack([np.asarray(r) for r in rows])


class NonFiniteLoss(Exception):
  """args: (step, what went wrong)."""


def _what_diverged(m, i):
  """The clause naming what is not finite in row i of the columns m."""
  if not np.isfinite(m['loss'][i]):
    return 'the loss is not finite'
  if not np.isfinite(m['grad_norm'][i]):
    return 'the gradient norm is not finite'
  return 'the parameters diverged (their norm overflows)'


class Progress:
  """Pending rows, the flush, the bar and the timer of one training run."""

  def __init__(self, config, log, *, start, stages, acc_key, primary):
    self.config, self.log, self.stages = config, log, stages
    self.acc_key = acc_key
    self.pending, self.held = [], []
    self.timer = StepTimer()
    self.bar = tqdm(
      total=config.num_train_steps,
      initial=start,
      desc='train',
      disable=not primary,
      dynamic_ncols=True,
      file=sys.stdout,
      # tqdm's own rate and ETA would count compilation and evaluation:
      # ours instead (eta: the steps left at the training steps/s,
      # evaluation not included).
      bar_format='{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}{postfix}]',
    )

  def step_done(self, step, metrics, compiled=False):
    """Records a step's (device) metrics, a packed row (lra.train.steps.ROW, the
    step's packed_lr), just after its dispatch;
    `compiled`: this step compiled (the first, or a new curriculum length),
    so the timer starts at its end. Then writes the row held at the last
    log step (log_step), while this step computes."""
    self.pending.append((step, metrics))
    self.bar.update(1)
    if compiled:
      jax.block_until_ready(metrics)
      self.timer.resume(step)
    self.write_held()

  def log_step(self):
    """At a log step: holds the stretch's metrics (step_done has written
    the previous held row). Their row is written after the next step is
    dispatched (step_done), so the device computes that step while the host
    reads and writes this one: no drain of the device's queue per log step.
    Reading waits for this step only, so the row's steps/s and the
    non-finite check are those of a synced flush, one step later."""
    self.held, self.pending = self.pending, []

  def write_held(self):
    """Writes the held row now, if any (before a step that compiles, and
    in step_done); raises NonFiniteLoss naming the step."""
    if self.held:
      held, self.held = self.held, []
      self._write(held)

  def resume_timer(self, step):
    """After work that is not training (evaluation, saving)."""
    self.timer.resume(step)

  def flush(self):
    """Syncs every pending metric (the held row's and those since) and
    writes their train rows; raises NonFiniteLoss naming the step. Before
    an evaluation or a save, so no checkpoint holds parameters that a
    non-finite step made."""
    self.write_held()
    pending, self.pending = self.pending, []
    self._write(pending)

  def _write(self, group):
    """Writes the train row of a stretch [(step, device metrics)] at its
    last step (nothing for an empty stretch); returns the row."""
    if not group:
      return None
    steps = [s for s, _ in group]
    values = fetched([m for _, m in group])
    m = dict(zip(ROW, values.T.copy()))  # a contiguous column per field
    bad = (
      ~np.isfinite(m['loss'])
      | ~np.isfinite(m['grad_norm'])
      | (m['params_finite'] == 0)
    )
    if bad.any():
      i = int(np.argmax(bad))
      raise NonFiniteLoss(steps[i], _what_diverged(m, i))
    step = steps[-1]
    config = self.config
    rate = self.timer.rate(step)  # the steps' results are back: they are done
    loss = float(np.mean(m['loss']))
    grad_norm = float(np.mean(m['grad_norm']))
    acc = sum(m['correct_sum'].tolist()) / sum(m['count'].tolist())
    # The rate the optimiser applied at this step (computed in the step:
    # schedule(its update count // grad_accum_steps)).
    lr = float(m['learning_rate'][-1])
    shown = {'loss': f'{loss:.4f}', 'acc': f'{acc:.3f}', 'lr': f'{lr:.3g}'}
    if rate is not None:
      left = (config.num_train_steps - step) / rate
      shown.update(steps_per_s=f'{rate:.2f}', eta=tqdm.format_interval(left))
    # A dict keeps this order (keywords sort); the bar redraws at its next
    # update (tqdm's mininterval), not here: a forced redraw each log step
    # is a terminal write on the loop's critical path.
    self.bar.set_postfix(shown, refresh=False)
    # The curriculum's input length at this step (lra/train/curriculum.py).
    length = (
      {'length': curriculum.length_at(self.stages, step, config.max_length)}
      if self.stages
      else {}
    )
    return self.log.write(
      step,
      'train',
      loss=loss,
      **{self.acc_key: acc},
      grad_norm=grad_norm,
      learning_rate=lr,
      steps_per_sec=rate,
      **length,
    )

  def write(self, text):
    """A line above the bar (primary process only: the bar is off
    elsewhere)."""
    if not self.bar.disable:
      tqdm.write(text)

  def close(self):
    self.bar.close()
