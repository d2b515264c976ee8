"""The README's commands, run as a user types them, at smoke size: its main
job (with ,smoke for ,small), every eval.py line against that run, and its
load_run example from another working directory (the package imported from
the project, as `pip install -e .` makes it)."""

import os
import re
import subprocess
import sys

from conftest import ROOT
import pytest


def readme_blocks(kind):
  """The lines of the README's ```<kind> blocks, continuation lines joined."""
  text = open(os.path.join(ROOT, 'README.md')).read()
  blocks = re.findall(rf'```{kind}\n(.*?)```', text, flags=re.S)
  return [b.replace('\\\n', ' ') for b in blocks]


def commands():
  """Every `python ...` line of the README's bash blocks, comments cut."""
  out = []
  for block in readme_blocks('bash'):
    for line in block.splitlines():
      line = line.split('  #')[0].strip()
      if line.startswith('python '):
        out.append(line)
  return out


def test_readme_is_a_manual_of_at_most_300_lines():
  lines = open(os.path.join(ROOT, 'README.md')).read().splitlines()
  assert len(lines) <= 300
  assert 'python -m pytest -q' in commands()
  assert 'python -m pip install -r requirements.txt' in commands()


def test_readme_links_resolve():
  text = open(os.path.join(ROOT, 'README.md')).read()
  for link in re.findall(r'\]\(([^)#]+)(?:#[^)]*)?\)', text):
    if not link.startswith('http'):
      assert os.path.exists(os.path.join(ROOT, link)), link


@pytest.fixture(scope='module')
def readme_run(tmp_path_factory, smoke_data_dir):
  """runs/listops made by the README's main job at smoke size, in a copy
  of the layout the README's commands assume (cwd = the project)."""
  runs = tmp_path_factory.mktemp('readme') / 'runs'
  main = [c for c in commands() if c.startswith('python train.py')][0]
  main = main.replace(',small', ',smoke').replace(
    'runs/listops', str(runs / 'listops')
  )
  argv = main.split()[1:] + [f'--config.data_dir={smoke_data_dir}']
  proc = subprocess.run(
    [sys.executable, *argv],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert os.path.exists(runs / 'listops' / 'results.json')
  return runs


def test_readme_eval_commands_run(readme_run, tmp_path):
  evals = [c for c in commands() if c.startswith('python eval.py')]
  assert len(evals) >= 3
  for line in evals:
    line = line.replace('runs/', f'{readme_run}/').replace(
      'runs ', f'{readme_run} '
    )
    if line.endswith(' runs'):
      line = line[: -len('runs')] + str(readme_run)
    proc = subprocess.run(
      [sys.executable, *line.split()[1:]],
      cwd=ROOT,
      capture_output=True,
      text=True,
      timeout=300,
    )
    assert proc.returncode == 0, (line, proc.stderr[-2000:])


def test_readme_load_run_example_from_another_directory(readme_run, tmp_path):
  (code,) = readme_blocks('python')
  code = code.replace("'runs/listops'", repr(str(readme_run / 'listops')))
  env = dict(os.environ, PYTHONPATH=ROOT)
  proc = subprocess.run(
    [sys.executable, '-c', code],
    cwd=tmp_path,
    env=env,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert proc.returncode == 0, proc.stderr[-2000:]
  import json  # pylint: disable=g-import-not-at-top

  results = json.load(open(readme_run / 'listops' / 'results.json'))
  # The example prints the test metrics of the best checkpoint: the same
  # accuracy train.py wrote.
  assert f"'accuracy': {results['test']['accuracy']}" in proc.stdout


def test_checkpoint_items_are_named(readme_run):
  """A save holds the items 'model' and 'opt_state', not '0' and '1'."""
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top

  best = readme_run / 'listops' / 'checkpoints' / 'best'
  step = max(os.listdir(best), key=int)
  meta = ocp.StandardCheckpointer().metadata(str(best / step / 'state'))
  assert set(meta.item_metadata.tree) == {'model', 'opt_state'}
