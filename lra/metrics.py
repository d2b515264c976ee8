"""metrics.jsonl (one JSON object per line) and results.json."""

import json
import os


class MetricsLog:
  """Appends rows; on resume, drops rows past the restored step so a resumed
  run's log equals an uninterrupted run's."""

  def __init__(self, workdir, resume_step=None):
    self.path = os.path.join(workdir, 'metrics.jsonl')
    rows = read_rows(self.path) if os.path.exists(self.path) else []
    if resume_step is not None:
      rows = [r for r in rows if r['step'] <= resume_step]
    else:
      rows = []
    with open(self.path, 'w') as f:
      for r in rows:
        f.write(json.dumps(r) + '\n')

  def write(self, step, split, **values):
    row = {'step': int(step), 'split': split, **values}
    with open(self.path, 'a') as f:
      f.write(json.dumps(row) + '\n')
    return row


def read_rows(path):
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def write_json(path, obj):
  tmp = path + '.tmp'
  with open(tmp, 'w') as f:
    json.dump(obj, f, indent=1, sort_keys=True)
  os.replace(tmp, path)
