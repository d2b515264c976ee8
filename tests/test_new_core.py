"""A new attention core is one file: the proof.

The test writes a throwaway core into models/attention/ of a copy of the
repository (so the suite's other processes, which discover the cores of
this one, never see it), then, in fresh processes as a user would: the shared
suites pick it up by themselves (tests/test_attention_suite.py and
tests/test_positions.py, nothing edited), and train.py trains a model named
after it, with its option set from the command line and recorded in
config.json. No list, config or test table is touched.
"""

import json
import os
import re
import shutil
import subprocess
import sys

from conftest import ROOT

NAME = 'throwaway_core'
SOURCE = '''"""A throwaway core from tests/test_new_core.py (deleted after).

Softmax attention with a temperature: exact at temperature 1.
"""

import jax.numpy as jnp

from models.attention.base import AttentionCore, attend, key_valid_BxM
from models.attention.registry import register


@register('throwaway_core')
class ThrowawayAttention(AttentionCore):
  rotary = 'scores'

  def __init__(
    self,
    *,
    num_heads,
    head_dim,
    max_length,
    dropout_rate,
    dtype,
    rngs,
    layer_index=0,
    temperature: float = 1.0,
  ):
    del num_heads, max_length, dtype, rngs, layer_index
    self.scale = 1.0 / (temperature * head_dim**0.5)
    self.rate = dropout_rate

  def __call__(self, q, k, v, mask, *, rngs=None, memory=None):
    b, length, m = q.shape[0], q.shape[1], k.shape[1]
    allowed = key_valid_BxM(mask, b, m)[:, None, None, :]
    if mask.causal:
      allowed = allowed & (
        jnp.arange(length)[:, None] >= jnp.arange(m)[None, :]
      )
    heads_first = lambda t: t.transpose(0, 2, 1, 3)
    out = attend(
      heads_first(q),
      heads_first(k),
      heads_first(v),
      allowed,
      scale=self.scale,
      rate=self.rate,
      key=rngs,
    )
    return heads_first(out), {}
'''


def run(args, cwd, **kw):
  return subprocess.run(
    [sys.executable, *args],
    cwd=cwd,
    capture_output=True,
    text=True,
    timeout=600,
    **kw,
  )


def test_a_new_core_is_one_file(tmp_path, smoke_data_dir):
  repo = str(tmp_path / 'repo')
  shutil.copytree(
    ROOT,
    repo,
    ignore=shutil.ignore_patterns(
      '.git', 'runs', 'docs', 'experiments', '__pycache__', '.pytest_cache'
    ),
  )
  path = os.path.join(repo, 'models', 'attention', f'{NAME}.py')
  assert not os.path.exists(path)
  with open(path, 'w') as f:
    f.write(SOURCE)
  suites = run(
    [
      '-m',
      'pytest',
      '-q',
      'tests/test_attention_suite.py',
      'tests/test_positions.py',
      '-k',
      NAME,
    ],
    repo,
  )
  assert suites.returncode == 0, suites.stdout[-3000:]
  passed = re.search(r'(\d+) passed', suites.stdout)
  # exact limit, padding, padded rows, causality, bf16, rotary
  assert passed and int(passed.group(1)) >= 6, suites.stdout[-2000:]
  workdir = str(tmp_path / 'run')
  trained = run(
    [
      'train.py',
      f'--config=configs/listops.py:{NAME},smoke',
      f'--workdir={workdir}',
      f'--config.data_dir={smoke_data_dir}',
      '--config.num_train_steps=2',
      '--config.eval_every_steps=2',
      '--config.model.attention.temperature=0.5',
    ],
    repo,
  )
  assert trained.returncode == 0, trained.stderr[-3000:]
  with open(os.path.join(workdir, 'results.json')) as f:
    assert json.load(f)['model'] == NAME
  with open(os.path.join(workdir, 'config.json')) as f:
    attention = json.load(f)['model']['attention']
  assert attention == {'name': NAME, 'temperature': 0.5}
  assert not os.path.exists(
    os.path.join(ROOT, 'models', 'attention', f'{NAME}.py')
  )
