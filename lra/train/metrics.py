"""metrics.jsonl (one JSON object per line), TensorBoard scalars beside it
(when tensorboardX is installed) and in Weights & Biases (with
--config.wandb_project, lra/train/wandb_log.py), results.json and the model
selection that decides which of its test numbers a run reports."""

import json
import numbers
import os
import sys
import time

from lra import commands
from lra.errors import UserError
from lra.train.wandb_log import WandbLog


class MetricsLog:
  """Appends rows; on resume, drops rows past the restored step so a resumed
  run's log equals an uninterrupted run's. Only the primary process (0 of a
  multi-process run) writes; the others get the rows back, unwritten.
  The run's config (a dict; default: <workdir>/config.json, which train.py
  writes first): its wandb_project, when set, also sends the rows' scalars
  to Weights & Biases (lra/train/wandb_log.py)."""

  def __init__(
    self, workdir, resume_step=None, primary=True, tensorboard=True, config=None
  ):
    self.primary = primary
    self.path = os.path.join(workdir, 'metrics.jsonl')
    self.tensorboard = self.wandb = self.file = None
    if not primary:
      return
    if tensorboard:
      self.tensorboard = TensorBoard.open(workdir, resume_step)
    saved = os.path.join(workdir, 'config.json')
    if config is None and os.path.isfile(saved):
      try:  # train.py wrote it just before (a damaged one: no wandb config)
        with open(saved) as f:
          config = json.load(f)
      except (OSError, ValueError):
        config = None
      config = config if isinstance(config, dict) else None
    self.wandb = WandbLog.open(workdir, config or {}, resume_step)
    rows = read_rows(self.path) if os.path.exists(self.path) else []
    if resume_step is not None:
      rows = [r for r in rows if r['step'] <= resume_step]
    else:
      rows = []
    # Rewritten through a temp file and a rename: a full disk here keeps
    # the old log whole (an open('w') would have emptied it first).
    tmp = self.path + '.tmp'
    try:
      with open(tmp, 'w') as f:
        for r in rows:
          f.write(json.dumps(r) + '\n')
      os.replace(tmp, self.path)
    finally:
      if os.path.exists(tmp):
        os.remove(tmp)

  def write(self, step, split, **values):
    row = {'step': int(step), 'split': split, **values}
    if not self.primary:
      return row
    # Kept open (opening it per row cost a tenth of a row's time) and
    # flushed per row: a killed run's rows are in the file.
    if self.file is None:
      self.file = open(self.path, 'a')
    self.file.write(json.dumps(row) + '\n')
    self.file.flush()
    if self.tensorboard:
      self.tensorboard.write(row)
    if self.wandb:
      self.wandb.write(row['step'], scalars(row))
    return row

  def close(self):
    if self.file is not None:
      self.file.close()
      self.file = None
    if self.tensorboard:
      self.tensorboard.close()
    if self.wandb:
      self.wandb.close()


def scalars(row):
  """{`<split>/<key>`: number} of a row, as TensorBoard and wandb log it
  (test rows as test_best/... and test_last/...; step, count and flags
  left out)."""
  split = row['split']
  if split == 'test':
    split = f'test_{row.get("checkpoint", "best")}'
  return {
    f'{split}/{key}': value
    for key, value in row.items()
    if key not in ('step', 'count')
    and not isinstance(value, bool)
    and isinstance(value, numbers.Real)
  }


class TensorBoard:
  """The rows' numbers as TensorBoard scalars in <workdir>/tensorboard/:
  `<split>/<key>` (train/loss, train/learning_rate, train/grad_norm,
  train/steps_per_sec, val/accuracy, ...; test rows as test_best/... and
  test_last/...), one event per row. Optional: tensorboardX (no TensorFlow)
  provides the event file's format when installed; without it, `open` says
  once how to get it and returns None. A resumed run purges the events past
  its restored step, as metrics.jsonl drops those rows.

  The events are written in the caller's thread by tensorboardX's
  synchronous EventsWriter: its SummaryWriter hands every event through a
  multiprocessing queue to a writer thread, CPU time per row that the
  training loop's cores pay; writing here costs a fraction of it (less
  with the `crc32c` package, which tensorboardX uses for the records'
  checksums when installed).
  Evaluation rows are flushed (fsync) at once; train rows when FLUSH_SECS
  have passed since the last flush, or at the next flush or close."""

  DIR = 'tensorboard'
  FLUSH_SECS = 30
  hinted = False

  @classmethod
  def hint(cls, workdir):
    """The note printed once when tensorboardX is missing: its commands
    spelt as they work where this program runs (lra/commands.py)."""
    board = os.path.join(workdir, cls.DIR)
    return (
      'note: pip install tensorboardX to also get TensorBoard scalars '
      f'(tensorboard --logdir {board}); metrics.jsonl and '
      f'`{commands.command("eval", "--plot", workdir)}` work without it.'
    )

  def __init__(self, writer, event_pb2, summary_pb2):
    self.writer, self.event_pb2 = writer, event_pb2
    self.summary_pb2 = summary_pb2
    self.flushed = time.monotonic()

  @classmethod
  def open(cls, workdir, resume_step=None):
    try:
      # pylint: disable=g-import-not-at-top,unused-import
      import tensorboardX  # noqa: F401 (first: its absence, not a submodule's)
      from tensorboardX.event_file_writer import EventsWriter
      from tensorboardX.proto import event_pb2, summary_pb2
    except ImportError:
      if not cls.hinted:
        print(cls.hint(workdir), flush=True)
        cls.hinted = True
      return None
    folder = os.path.join(workdir, cls.DIR)
    os.makedirs(folder, exist_ok=True)
    # The file starts with its version event (EventsWriter writes it).
    board = cls(
      EventsWriter(os.path.join(folder, 'events')), event_pb2, summary_pb2
    )
    if resume_step is not None:
      # TensorBoard drops the earlier files' events from this step on (a
      # session restart), as tensorboardX's purge_step asks.
      start = board.event_pb2.SessionLog(
        status=board.event_pb2.SessionLog.START
      )
      board.writer.write_event(
        board.event_pb2.Event(
          wall_time=time.time(), step=resume_step + 1, session_log=start
        )
      )
      board.flush()
    return board

  def write(self, row):
    summary = self.summary_pb2.Summary
    values = [
      summary.Value(tag=name, simple_value=float(value))
      for name, value in scalars(row).items()
    ]
    if values:
      self.writer.write_event(
        self.event_pb2.Event(
          wall_time=time.time(),
          step=row['step'],
          summary=summary(value=values),
        )
      )
    if row['split'] != 'train' or (
      time.monotonic() - self.flushed >= self.FLUSH_SECS
    ):
      self.flush()

  def flush(self):
    self.writer.flush()
    self.flushed = time.monotonic()

  def close(self):
    self.writer.close()


class StepTimer:
  """Training steps per second over stretches of training only.

  `resume(step)` starts a stretch once `step` is done and whatever is not
  training (compiling the first step, an evaluation, a checkpoint) is over;
  `rate(step)` ends it at `step`, after that step's metrics came back from
  the device (so its work is finished), returns the stretch's steps/s (None
  when no step was timed) and starts the next stretch there.
  """

  def __init__(self):
    self.step = self.start = None

  def resume(self, step):
    self.step, self.start = step, time.perf_counter()

  def rate(self, step):
    if self.step is None or step <= self.step:
      return None
    now = time.perf_counter()
    rate = (step - self.step) / max(now - self.start, 1e-9)
    self.step, self.start = step, now
    return rate


def read_rows(path):
  """The rows of a metrics.jsonl file. A line that is not a JSON object (a
  torn last line after a crash mid-write) is skipped with one warning; a
  file that is no metrics log at all (a directory, binary bytes, no row
  of it readable) is one sentence naming it (UserError): a resume would
  otherwise rewrite it with nothing in it."""
  rows, torn = [], []
  try:
    with open(path, 'rb') as f:
      raw = f.read()
  except OSError as e:
    why = 'is a directory' if os.path.isdir(path) else 'cannot be read'
    raise UserError(
      f'{path} {why} ({e.strerror or e}), not a metrics log; restore it or '
      'move it away, then run again.'
    ) from None
  try:
    text = raw.decode('utf-8')
  except UnicodeDecodeError as e:
    line = raw.count(b'\n', 0, e.start) + 1
    raise UserError(
      f'{path} holds binary bytes (line {line}), not a metrics log of '
      'JSON rows; restore it or move it away, then run again.'
    ) from None
  for number, line in enumerate(text.splitlines(), 1):
    if not line.strip():
      continue
    try:
      row = json.loads(line)
    except ValueError:
      row = None
    if isinstance(row, dict) and isinstance(row.get('step'), int):
      rows.append(row)
    else:
      torn.append(number)
  if torn and not rows and len(torn) > 1:
    raise UserError(
      f'{path} has no readable row ({len(torn)} lines, none a JSON row '
      'with a step): not a metrics log; restore it or move it away, then '
      'run again.'
    )
  if torn:
    print(
      f'warning: {path}: skipped {len(torn)} damaged line(s) (line '
      f'{torn[0]}{", ..." if len(torn) > 1 else ""}), e.g. a write cut short.',
      file=sys.stderr,
    )
  return rows


def write_json(path, obj):
  """Writes `obj` to `path` through a temp file and a rename (a reader
  never sees half a file; a failed write, e.g. a full disk, leaves the old
  file whole and no temp file behind)."""
  tmp = path + '.tmp'
  try:
    with open(tmp, 'w') as f:
      json.dump(obj, f, indent=1, sort_keys=True)
    os.replace(tmp, path)
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)


# ------------------------------------------------------- model selection
# Which checkpoint's test accuracy a run reports (config.select):
#   'best_val'  the checkpoint with the best validation accuracy (results
#               'test'); honest only when validation is not the test set;
#   'last'      the final step's checkpoint (results 'test_last'), as the
#               LRA reference reported (it tested the last checkpoint).
#   ''          automatic: 'last' when the validation split is the test set
#               (Text with data.val='test', as the reference), else
#               'best_val'.
SELECTIONS = ('best_val', 'last')
# The results.json key holding each selection's test metrics.
SELECTED_KEY = {'best_val': 'test', 'last': 'test_last'}


def val_is_test(config):
  """True when the run validates on its test set: only Text with
  data.val='test' (the reference's setting; IMDB has no validation split).
  ListOps, Retrieval, Image and Pathfinder have their own validation split
  (the release's val / eval files, CIFAR's train[90%:], 10% of Pathfinder's
  images)."""
  return config['task'] == 'text' and config['data'].get('val') == 'test'


def selection(config):
  """config.select resolved: 'best_val' or 'last'; one sentence if bad."""
  select = config.get('select', '')
  if select == '':
    return 'last' if val_is_test(config) else 'best_val'
  if select not in SELECTIONS:
    raise UserError(
      f'--config.select={select} is not a model selection; use best_val '
      "(the best-validation checkpoint), last (the final step's, as the LRA "
      "reference) or '' (last when validation is the test set, else "
      'best_val).'
    )
  return select


def flatten(tree, prefix=''):
  """{'model.num_layers': 4, ...} of a nested dict (empty dicts kept)."""
  out = {}
  for key, value in tree.items():
    if isinstance(value, dict) and value:
      out.update(flatten(value, f'{prefix}{key}.'))
    else:
      out[f'{prefix}{key}'] = value
  return out
