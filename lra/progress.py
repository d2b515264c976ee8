"""The training loop's reporting: pending step metrics, the progress bar and
the steps/s timer, in one object (train.py's loop calls it, nothing else).

Step metrics stay on the device until a log step; `flush` brings them back
in one transfer, stops the run on a non-finite loss or diverged parameters
(NonFiniteLoss naming the step), writes the metrics.jsonl train row and
updates the bar. steps/s counts training steps only: the timer is resumed
after compilation, evaluation and saving.
"""

import sys

import jax
import numpy as np
from tqdm import tqdm

from lra import curriculum
from lra.metrics import StepTimer


class NonFiniteLoss(Exception):
  """args: (step, what went wrong)."""


class Progress:
  """Pending rows, the flush, the bar and the timer of one training run."""

  def __init__(self, config, log, *, start, stages, schedule, acc_key, primary):
    self.config, self.log, self.stages = config, log, stages
    self.schedule, self.acc_key = schedule, acc_key
    self.accum = max(config.grad_accum_steps, 1)
    self.pending = []
    # The schedule's first evaluation compiles its ops (about 1 s on a CPU):
    # done now, not inside the first timed stretch of steps.
    float(schedule(0))
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
    """Records a step's (device) metrics; `compiled`: this step compiled
    (the first, or a new curriculum length), so the timer starts at its
    end."""
    self.pending.append((step, metrics))
    self.bar.update(1)
    if compiled:
      jax.block_until_ready(metrics)
      self.timer.resume(step)

  def resume_timer(self, step):
    """After work that is not training (evaluation, saving)."""
    self.timer.resume(step)

  def flush(self, step):
    """Syncs the pending metrics; raises NonFiniteLoss naming the step;
    writes the train row (returned) when there were any."""
    rows = jax.device_get(self.pending)
    self.pending = []
    for s, m in rows:
      if not np.isfinite(m['loss']):
        raise NonFiniteLoss(s, 'the loss is not finite')
      if not m['params_finite']:
        raise NonFiniteLoss(s, 'the parameters diverged (their norm overflows)')
    if not rows:
      return None
    config = self.config
    rate = self.timer.rate(step)  # the steps' results are back: they are done
    loss = float(np.mean([m['loss'] for _, m in rows]))
    grad_norm = float(np.mean([m['grad_norm'] for _, m in rows]))
    acc = sum(float(m['correct_sum']) for _, m in rows) / sum(
      float(m['count']) for _, m in rows
    )
    # The rate the optimiser applied at this step (its count: the updates
    # before it; one update per grad_accum_steps steps).
    lr = float(self.schedule((step - 1) // self.accum))
    shown = {'loss': f'{loss:.4f}', 'acc': f'{acc:.3f}', 'lr': f'{lr:.3g}'}
    if rate is not None:
      left = (config.num_train_steps - step) / rate
      shown.update(steps_per_s=f'{rate:.2f}', eta=tqdm.format_interval(left))
    self.bar.set_postfix(shown)  # a dict keeps this order (keywords sort)
    # The curriculum's input length at this step (lra/curriculum.py).
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
