"""The training loop's reporting: pending step metrics, the progress bar and
the steps/s timer, in one object (train.py's loop calls it, nothing else).

Step metrics stay on the device until a log step. `log_step` holds them;
their row is read and written after the next step is dispatched, so the
device is never drained for it; `flush` (before an evaluation or a save)
reads everything pending at once. Reading stops the run on a non-finite
loss or diverged parameters (NonFiniteLoss naming the step), writes the
metrics.jsonl train row and updates the bar. steps/s counts training steps
only: the timer is resumed after compilation, evaluation and saving.

What the user sees: on a terminal, a bar whose steps/s and ETA are
recomputed at every redraw from the measured rate (every training-only
second timed so far, the current stretch included: the ETA counts down
between log steps), and whose loss, accuracy and learning rate are those of
the last log step (reading them each step would drain the device). When the
output is not a terminal (a file, a pipe, a sweep's log), plain lines
instead, with no carriage returns or cursor codes: one after the first log
step, then one every LINE_EVERY_S seconds, and one at the end.
"""

import sys
import time

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
  reading each is cheaper (no transfer to start)."""
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
  """Pending rows, the flush, the bar (or plain lines) and the timer of one
  training run. `stream` (default sys.stdout) is where they go; a bar only
  when it is a terminal."""

  # Plain lines (output not a terminal): at most one per this many seconds.
  LINE_EVERY_S = 30.0
  # The bar's steps/s and ETA are recomputed at most this often.
  SHOW_EVERY_S = 0.5

  def __init__(
    self, config, log, *, start, stages, acc_key, primary, stream=None
  ):
    self.config, self.log, self.stages = config, log, stages
    self.acc_key = acc_key
    self.pending, self.held = [], []
    self.timer = StepTimer()
    self.stream = sys.stdout if stream is None else stream
    isatty = getattr(self.stream, 'isatty', None)
    self.terminal = bool(isatty and isatty())
    self.primary = primary
    # The measured rate: steps and seconds of the stretches timed so far.
    self.timed_steps, self.timed_s = 0, 0.0
    self.step, self.shown = start, {}  # the last step dispatched, the postfix
    self.shown_at = self.line_at = None  # when postfix / a line was last made
    self.line_step = start  # the step of the last plain line
    self.bar = tqdm(
      total=config.num_train_steps,
      initial=start,
      desc='train',
      disable=not primary or not self.terminal,
      dynamic_ncols=True,
      file=self.stream,
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
    self.step = step
    if compiled:
      jax.block_until_ready(metrics)
      self.timer.resume(step)
    if self.primary:
      self._show(step)
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

  def rate(self, now=None):
    """The measured training steps/s: every stretch timed so far (from the
    synced rows) plus the current one up to the last step dispatched. None
    before a step was timed. The host runs ahead of the device by at most
    the steps queued since the last synced row, so the current stretch's
    share overestimates by at most that many steps."""
    steps, seconds = self.timed_steps, self.timed_s
    if self.timer.step is not None and self.step > self.timer.step:
      now = time.perf_counter() if now is None else now
      steps += self.step - self.timer.step
      seconds += now - self.timer.start
    return steps / seconds if steps and seconds > 0 else None

  def _show(self, step):
    """Per step: the bar's position; its steps/s and ETA from the measured
    rate every SHOW_EVERY_S seconds; a plain line every LINE_EVERY_S."""
    self.bar.update(1)
    now = time.perf_counter()
    if self.terminal:
      if self.shown_at is None or now - self.shown_at >= self.SHOW_EVERY_S:
        self.shown_at = now
        self.shown.update(self._pace(step, now))
        # The bar redraws at its next update (tqdm's mininterval): a forced
        # redraw is a terminal write on the loop's critical path.
        self.bar.set_postfix(self.shown, refresh=False)
    elif self.line_at is not None and now - self.line_at >= self.LINE_EVERY_S:
      self._line(step, now)

  def _pace(self, step, now):
    """{'steps_per_s', 'eta'} at `step` from the measured rate ({} before
    a step was timed)."""
    rate = self.rate(now)
    if rate is None:
      return {}
    left = max(self.config.num_train_steps - step, 0) / rate
    return {'steps_per_s': f'{rate:.2f}', 'eta': tqdm.format_interval(left)}

  def _line(self, step, now=None):
    """One plain progress line (output not a terminal)."""
    now = time.perf_counter() if now is None else now
    self.line_at, self.line_step = now, step
    total = self.config.num_train_steps
    shown = {**self.shown, **self._pace(step, now)}
    parts = [f'{k.replace("_per_", "/")} {v}' for k, v in shown.items()]
    head = f'train step {step}/{total} ({100 * step / max(total, 1):.0f}%)'
    print(', '.join([head, *parts]), file=self.stream, flush=True)

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
    timed_from = self.timer.step
    rate = self.timer.rate(step)  # the steps' results are back: they are done
    if rate is not None:
      self.timed_steps += step - timed_from
      self.timed_s += (step - timed_from) / rate
    loss = float(np.mean(m['loss']))
    grad_norm = float(np.mean(m['grad_norm']))
    acc = sum(m['correct_sum'].tolist()) / sum(m['count'].tolist())
    # The rate the optimiser applied at this step (computed in the step:
    # schedule(its update count // grad_accum_steps)).
    lr = float(m['learning_rate'][-1])
    # A dict keeps this order (keywords sort).
    self.shown = {'loss': f'{loss:.4f}', 'acc': f'{acc:.3f}', 'lr': f'{lr:.3g}'}
    if self.primary:
      now = time.perf_counter()
      if self.terminal:
        self.shown_at = now
        self.shown.update(self._pace(self.step, now))
        self.bar.set_postfix(self.shown, refresh=False)
      elif self.line_at is None:  # the first line: at the first log step
        self._line(self.step, now)
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
    """A line above the bar, or a plain line (primary process only)."""
    if not self.primary:
      return
    if self.terminal:
      tqdm.write(text, file=self.stream)
    else:
      print(text, file=self.stream, flush=True)

  def close(self):
    """Closes the bar; without one, a last plain line for the steps since
    the previous one."""
    if self.primary and not self.terminal and self.step != self.line_step:
      self._line(self.step)
    self.bar.close()
