"""The train smoke run on every task: release-format fixtures for the
converted tasks, generated data for the synthetic ones."""

import json
import os

import numpy as np
import pytest
import release_fixtures as fx
from test_train import run

from lra.train.metrics import read_rows


@pytest.fixture(scope='module')
def data_dir(tmp_path_factory):
  return fx.write_release_data(str(tmp_path_factory.mktemp('release')))


@pytest.mark.parametrize(
  'task',
  [
    'text',
    'retrieval',
    'image',
    'pathfinder',
    # Path-X is Pathfinder's module at another resolution: kept out of CI.
    pytest.param('pathx', marks=pytest.mark.slow),
  ],
)
def test_train_smoke_on_task(task, data_dir, tmp_path):
  workdir = str(tmp_path / task)
  run(
    'train.py',
    f'--config=configs/{task}.py:transformer,smoke',
    f'--workdir={workdir}',
    f'--config.data_dir={data_dir}',
  )
  results = json.load(open(os.path.join(workdir, 'results.json')))
  assert results['task'] == task and results['test']['count'] > 0
  rows = read_rows(os.path.join(workdir, 'metrics.jsonl'))
  assert all(np.isfinite(r['loss']) for r in rows)
