"""Weights & Biases logging, optional: --config.wandb_project=NAME (''
= off) sends the TensorBoard scalars of every metrics.jsonl row (the same
`<split>/<key>` names, lra.train.metrics.scalars) with the row's `step` as the
x-axis, and the run's config once per start. Only process 0 logs
(MetricsLog).

wandb keeps its files in <workdir>/wandb/. --config.wandb_mode is wandb's
mode: '' (wandb's own default: the WANDB_MODE environment variable, else
online), 'online', 'offline' (no network: `wandb sync <workdir>/wandb/
offline-run-*` uploads it later) or 'disabled'. The run's id is kept in
<workdir>/wandb_run.json, so a resumed workdir continues the same wandb run
(resume='allow'; wandb cannot resume an offline run: each start then
writes its own offline-run-* folder under that id). The rows wandb already
got before a kill are not sent again (wandb cannot drop them as
metrics.jsonl and TensorBoard do; a resumed run repeats them exactly).
A run wandb cannot start (online without a login or a network) stops with
one sentence; wandb's terminal output is kept short (settings quiet,
console off: the progress bar stays ours).
"""

import json
import os

from lra.errors import UserError

MODES = ('online', 'offline', 'disabled')
FILE = 'wandb_run.json'
MISSING = '--config.wandb_project needs the wandb package: pip install wandb'


def check(config):
  """Raises UserError (one sentence) for a bad wandb_mode, or a
  wandb_project without the wandb package; before anything is written."""
  mode = config.get('wandb_mode', '')
  if mode not in ('', *MODES):
    raise UserError(
      f'--config.wandb_mode={mode} is not one of {", ".join(MODES)} (or '
      "empty: wandb's own default); e.g. --config.wandb_mode=offline."
    )
  if config.get('wandb_project', ''):
    try:
      import wandb  # noqa: F401  pylint: disable=g-import-not-at-top
    except ImportError:
      raise UserError(MISSING) from None


class WandbLog:
  """One wandb run of a workdir; `write` takes a row's scalars."""

  def __init__(self, run, path, logged):
    self.run, self.path, self.logged = run, path, logged

  @classmethod
  def open(cls, workdir, config, resume_step=None):
    """Starts (or, when resuming, continues) the workdir's wandb run; None
    without a wandb_project. `config`: the run's, as a dict
    (config.json's contents)."""
    project = config.get('wandb_project', '')
    if not project:
      return None
    import wandb  # pylint: disable=g-import-not-at-top

    path = os.path.join(workdir, FILE)
    saved = {}
    if resume_step is not None and os.path.exists(path):
      with open(path) as f:
        saved = json.load(f)
    try:
      run = start(wandb, project, workdir, config, saved)
    except wandb.errors.Error as e:  # online without a login, no network
      raise UserError(
        f'wandb could not start the run: {str(e).rstrip(".")}; '
        '--config.wandb_mode=offline logs without a network or a login.'
      ) from None
    run.define_metric('*', step_metric='step')
    log = cls(run, path, saved.get('logged', {}))
    log.save()
    return log

  def write(self, step, scalars):
    """Logs {`<split>/<key>`: value} at `step`, unless wandb got that
    split's rows up to `step` before this process started."""
    if not scalars:
      return
    split = next(iter(scalars)).split('/')[0]
    if step <= self.logged.get(split, -1):
      return
    self.run.log({'step': step, **scalars})
    self.logged[split] = step
    self.save()

  def save(self):
    """<workdir>/wandb_run.json: the run's id and, per split, the last
    step sent."""
    tmp = self.path + '.tmp'
    with open(tmp, 'w') as f:
      json.dump({'id': self.run.id, 'logged': self.logged}, f)
    os.replace(tmp, self.path)

  def close(self):
    self.run.finish()


def start(wandb, project, workdir, config, saved):
  """wandb.init of the workdir's run: a new one, or the one of `saved`
  (wandb_run.json) continued."""
  return wandb.init(
    project=project,
    mode=config.get('wandb_mode', '') or None,
    dir=workdir,
    id=saved.get('id'),
    resume='allow' if saved else None,
    name=os.path.basename(os.path.abspath(workdir)),
    config=config,
    allow_val_change=True,  # a resumed run's new optimiser settings
    reinit='create_new',
    # The terminal stays ours: wandb neither captures it (the progress
    # bar) nor prints its run summary after our last line.
    settings=wandb.Settings(console='off', quiet=True),
  )
