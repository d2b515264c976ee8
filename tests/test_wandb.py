"""Weights & Biases logging (lra/train/wandb_log.py) in offline mode: a smoke run
stopped at step 3 and resumed to 6 logs metrics.jsonl's scalars (the
TensorBoard names, the row's step) to one wandb run id, each row once; and
the one sentence when the wandb package is missing."""

import glob
import json
import os
import struct
import sys
import time

import pytest

from configs import listops
from lra.errors import UserError
from lra.train import steps, validate, wandb_log
from lra.train.metrics import read_rows, scalars
import train


@pytest.fixture
def offline(tmp_path, monkeypatch):
  """wandb offline, its own folders under tmp_path (never the user's)."""
  monkeypatch.setenv('WANDB_MODE', 'offline')
  for name in ('CONFIG', 'CACHE', 'DATA'):
    monkeypatch.setenv(f'WANDB_{name}_DIR', str(tmp_path / name.lower()))


@pytest.fixture
def shared_steps(monkeypatch):
  """The resumed start reuses the first start's compiled steps: one
  compilation instead of two. Exact here: the models are the same and the
  smoke optimiser (rsqrt schedule) does not depend on num_train_steps; the
  graphdefs differ only in the optax closures' identity."""
  for name in ('make_train_step', 'make_eval_step'):
    made, make = [], getattr(steps, name)

    def first(*args, made=made, make=make, **kwargs):
      if not made:
        made.append(make(*args, **kwargs))
      return made[0]

    monkeypatch.setattr(steps, name, first)


def smoke_config(data_dir, **overrides):
  config = listops.get_config('transformer,smoke')
  config.data_dir = data_dir
  config.wandb_project = 'lra-test'
  config.update(overrides)
  return config


def records(run_dir):
  """The Record protos of an offline run: its .wandb file is a LevelDB log
  (32 KiB blocks of pieces with a 7-byte header: crc, length, type) after
  a 7-byte file header."""
  from wandb.proto import wandb_internal_pb2 as pb

  (path,) = glob.glob(os.path.join(run_dir, '*.wandb'))
  data = open(path, 'rb').read()
  assert data[:4] == b':W&B'
  pos, record, block = 7, b'', 32768
  while pos + 7 <= len(data):
    if block - pos % block < 7:  # the block's zero-filled tail
      pos += block - pos % block
      continue
    length, kind = struct.unpack('<HB', data[pos + 4 : pos + 7])
    if pos + 7 + length > len(data):  # a piece still being written
      return
    record += data[pos + 7 : pos + 7 + length]
    pos += 7 + length
    if kind in (1, 4):  # a whole record, or the last piece of one
      yield pb.Record.FromString(record)
      record = b''


def items(update):
  """{key: value} of a history or config record (wandb's own keys, which
  start with '_', left out)."""
  return {
    i.key or '/'.join(i.nested_key): json.loads(i.value_json)
    for i in update
    if not (i.key or i.nested_key[0]).startswith('_')
  }


def finished_records(run_dir, timeout=120.0):
  """The run's records once its last one, the exit record, is on disk:
  run.finish() returns before wandb's service process has written the
  file out (seen under load: the records of the last steps came later)."""
  deadline = time.monotonic() + timeout
  while True:
    found = list(records(run_dir))
    if found and found[-1].HasField('exit') or time.monotonic() > deadline:
      return found
    time.sleep(0.2)


def history(run_dir):
  return [
    items(r.history.item)
    for r in finished_records(run_dir)
    if r.HasField('history')
  ]


def test_offline_run_logs_the_scalars_once_and_resumes_the_same_id(
  tmp_path, offline, shared_steps, smoke_data_dir
):
  pytest.importorskip('wandb')
  workdir = str(tmp_path / 'run')
  train.train_and_evaluate(
    smoke_config(smoke_data_dir, num_train_steps=3), workdir
  )
  first = json.load(open(os.path.join(workdir, wandb_log.FILE)))
  train.train_and_evaluate(smoke_config(smoke_data_dir), workdir)  # to 6
  second = json.load(open(os.path.join(workdir, wandb_log.FILE)))
  assert first['id'] == second['id']
  best = json.load(open(os.path.join(workdir, 'results.json')))['best_step']
  assert second['logged'] == {
    'train': 6, 'val': 6, 'test_best': best, 'test_last': 6
  }  # fmt: skip
  runs = sorted(glob.glob(os.path.join(workdir, 'wandb', 'offline-run-*')))
  assert len(runs) == 2 and all(r.endswith(first['id']) for r in runs)
  logged = [history(r) for r in runs]
  # metrics.jsonl's train and val rows, each sent once: steps 2, 3 by the
  # first start, the rest by the resumed one.
  rows = read_rows(os.path.join(workdir, 'metrics.jsonl'))
  expected = [
    {'step': r['step'], **scalars(r)}
    for r in rows
    if r['split'] in ('train', 'val')
  ]
  sent = [h for h in logged[0] + logged[1] if 'test' not in str(h)]
  assert sent == expected
  assert {h['step'] for h in logged[1]} == {4, 6}
  assert {'train/loss', 'train/accuracy', 'train/learning_rate'} <= set(sent[0])
  # The last start's test rows, as TensorBoard names them.
  tested = {k for h in logged[1] for k in h if k.startswith('test_')}
  assert 'test_last/accuracy' in tested
  # The config, once per start, in the run's record.
  for path in runs:
    (run,) = [r.run for r in records(path) if r.HasField('run')]
    config = items(run.config.update)
    assert run.run_id == first['id'] and run.project == 'lra-test'
    assert config['task'] == 'listops' and config['model']['num_layers'] == 1


def test_missing_wandb_is_one_sentence_before_the_workdir(
  tmp_path, monkeypatch, smoke_data_dir
):
  monkeypatch.setitem(sys.modules, 'wandb', None)  # import wandb fails
  workdir = str(tmp_path / 'run')
  with pytest.raises(UserError) as e:
    train.train_and_evaluate(smoke_config(smoke_data_dir), workdir)
  assert str(e.value) == (
    '--config.wandb_project needs the wandb package: pip install wandb'
  )
  assert not os.path.exists(workdir)
  validate.check_config(smoke_config(smoke_data_dir, wandb_project=''))


def test_bad_wandb_mode_is_refused(smoke_data_dir):
  with pytest.raises(UserError, match='--config.wandb_mode=offlne is not'):
    validate.check_config(smoke_config(smoke_data_dir, wandb_mode='offlne'))
