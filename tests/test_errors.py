"""Every error a user can cause: one sentence on stderr, exit 2, no trace."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMOKE = 'configs/listops.py:transformer,smoke'


def fails(script, *args, match):
  proc = subprocess.run(
    [sys.executable, script, *args],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
  assert 'Traceback' not in proc.stderr, proc.stderr
  last = proc.stderr.strip().splitlines()[-1]
  assert last.startswith('error: ') and match in last, last
  return last


@pytest.mark.parametrize(
  'args, match',
  [
    (['--config.modle.num_layers=2'], "Unknown config key 'modle'"),
    (['--config.model.num_layerz=2'], "(did you mean 'num_layers'?)"),
    (['--config.batch_size=abc'], 'batch_size'),
    (['--config.task=nope'], 'known tasks: listops, text'),
    (['--config.batch_size=6'], 'not divisible by the 4 devices'),
    (['--config.dtype=float16'], 'use float32 or bfloat16'),
    (['--config.model.pooling=sum'], 'Unknown pooling'),
    (['--config.model.attention.window=3'], "config key 'window'"),
  ],
)
def test_bad_train_flags(tmp_path, args, match):
  fails(
    'train.py',
    f'--config={SMOKE}',
    f'--workdir={tmp_path}',
    f'--config.data_dir={tmp_path}/data',
    *args,
    match=match,
  )


def test_unknown_model_lists_known_models(tmp_path):
  fails(
    'train.py',
    '--config=configs/listops.py:nope',
    f'--workdir={tmp_path}',
    match='known models: transformer',
  )


def test_unknown_config_file(tmp_path):
  fails(
    'train.py',
    '--config=configs/nope.py:transformer',
    f'--workdir={tmp_path}',
    match='configs/listops.py',
  )


def test_unknown_task_in_prepare():
  proc = subprocess.run(
    [sys.executable, '-m', 'lra.prepare', 'nope'],
    cwd=ROOT,
    capture_output=True,
    text=True,
  )
  assert proc.returncode == 2 and 'known tasks' in proc.stderr
  assert 'Traceback' not in proc.stderr


def test_malformed_release_tsv_names_file_and_line(tmp_path):
  release = tmp_path / 'data' / 'listops' / 'release'
  release.mkdir(parents=True)
  good = '( ( ( [MAX 2 ) 9 ) ] )\t9\n'
  for split in ('train', 'val', 'test'):
    body = 'Source\tTarget\n' + good * 3
    if split == 'train':
      body += '( ( [MIN 2 ) ] )\tseven\n'
    (release / f'basic_{split}.tsv').write_text(body)
  last = fails(
    'train.py',
    '--config=configs/listops.py:transformer,smoke',
    '--config.data.variant=full',
    f'--workdir={tmp_path}/run',
    f'--config.data_dir={tmp_path}/data',
    match='basic_train.tsv',
  )
  assert ':5' in last or 'line 5' in last


def test_missing_text_data_names_the_file_to_fetch(tmp_path):
  fails(
    'train.py',
    '--config=configs/text.py:transformer,smoke',
    f'--workdir={tmp_path}/run',
    f'--config.data_dir={tmp_path}/data',
    match='aclImdb_v1.tar.gz',
  )


def test_eval_without_a_run(tmp_path):
  fails('eval.py', f'--workdir={tmp_path}', match='config.json does not exist')
