"""Printed hints are commands that work where they were printed
(lra/commands.py): the console script when started as one or from outside a
checkout, the shim's path in a checkout, and no hint under lra/ spelt by
hand."""

import ast
import json
import os
import pathlib
import re
import shlex
import subprocess
import sys

from lra import commands
from lra.train import results
from lra.train.metrics import TensorBoard

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_console_script_gives_console_scripts(tmp_path):
  for cwd in (ROOT, str(tmp_path)):
    assert commands.program('eval', '/venv/bin/lra-train', cwd) == 'lra-eval'
    assert commands.program('sweep', '/venv/bin/lra-eval', cwd) == 'lra-sweep'


def test_checkout_gives_the_shims_and_modules():
  assert commands.program('eval', 'train.py', ROOT) == 'python eval.py'
  assert commands.program('benchmark', 'eval.py', ROOT) == (
    'python benchmark.py'
  )
  assert commands.program('prepare', 'train.py', ROOT) == (
    'python -m lra.data.prepare'
  )
  # pytest, python -m lra.sweep, ...: the checkout is the working directory.
  assert commands.program('sweep', '/x/pytest', ROOT) == 'python -m lra.sweep'


def test_shim_run_by_path_from_elsewhere(tmp_path):
  argv0 = os.path.join(ROOT, 'train.py')
  hint = commands.program('eval', argv0, str(tmp_path))
  assert hint.startswith('python ') and hint.endswith('eval.py')
  script = hint.split(' ', 1)[1]
  assert not os.path.isabs(script)
  assert os.path.samefile(os.path.join(tmp_path, script), ROOT + '/eval.py')
  # python -m needs the checkout on sys.path: the console script instead.
  assert commands.program('prepare', argv0, str(tmp_path)) == 'lra-prepare'


def test_installed_package_gives_console_scripts(tmp_path):
  main = '/venv/lib/python3.11/site-packages/lra/train/main.py'
  assert commands.program('eval', main, str(tmp_path)) == 'lra-eval'
  assert commands.program('train', '-c', str(tmp_path)) == 'lra-train'


def test_command_quotes_its_arguments(monkeypatch):
  monkeypatch.setattr(sys, 'argv', ['/venv/bin/lra-train'])
  assert commands.command('eval', '--plot', 'runs/my run') == (
    "lra-eval --plot 'runs/my run'"
  )
  assert commands.command('benchmark', '--out', pathlib.Path('b')) == (
    'lra-benchmark --out b'
  )


def test_train_hints_follow_how_it_was_started(monkeypatch, tmp_path):
  """The final line and the TensorBoard note of a run."""
  monkeypatch.chdir(tmp_path)
  monkeypatch.setattr(sys, 'argv', ['/venv/bin/lra-train'])
  line = results.where_results('runs/a', False)
  assert 'curves: lra-eval --plot runs/a ' in line
  assert 'python' not in line.split('TensorBoard')[0]
  assert '`lra-eval --plot runs/a`' in TensorBoard.hint('runs/a')
  assert 'tensorboard --logdir runs/a/tensorboard' in TensorBoard.hint('runs/a')
  monkeypatch.chdir(ROOT)
  monkeypatch.setattr(sys, 'argv', ['train.py'])
  assert 'curves: python eval.py --plot runs/a ' in results.where_results(
    'runs/a', False
  )


def test_printed_hint_runs_where_it_was_printed(monkeypatch, tmp_path):
  """`python ../main/train.py` from another folder: its curves hint, run
  from that folder, writes the curves."""
  run = tmp_path / 'run'
  run.mkdir()
  rows = [
    {'step': s, 'split': split, 'loss': 1.0 / s, 'accuracy': 0.1 * s}
    for s in (1, 2)
    for split in ('train', 'val')
  ]
  (run / 'metrics.jsonl').write_text(
    ''.join(json.dumps(r) + '\n' for r in rows)
  )
  elsewhere = tmp_path / 'elsewhere'
  elsewhere.mkdir()
  monkeypatch.chdir(elsewhere)
  train = os.path.relpath(os.path.join(ROOT, 'train.py'))
  monkeypatch.setattr(sys, 'argv', [train])
  line = results.where_results(str(run), False)
  hint = re.search(r'curves: (.*?) \(writes', line).group(1)
  argv = shlex.split(hint)
  assert argv[0] == 'python' and argv[1].endswith('eval.py'), hint
  proc = subprocess.run(
    [sys.executable, *argv[1:]],
    cwd=elsewhere,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert proc.returncode == 0, proc.stderr
  assert (run / 'curves_loss.png').is_file()


# A command spelt by hand in a string of lra/ (docstrings and flag help,
# which describe rather than instruct, aside).
_HAND_SPELT = re.compile(
  r'python (-m lra\.(data\.prepare|sweep)\b|(eval|train|benchmark|scaling)\.py)'
)


def _hand_spelt(path):
  tree = ast.parse(path.read_text())
  skip = set()
  for node in ast.walk(tree):
    body = getattr(node, 'body', None)
    if (
      isinstance(body, list)
      and body
      and isinstance(body[0], ast.Expr)
      and isinstance(body[0].value, ast.Constant)
    ):
      skip.add(id(body[0].value))
    if isinstance(node, ast.Call):
      name = getattr(node.func, 'attr', getattr(node.func, 'id', ''))
      if name.startswith('DEFINE') or name == 'add_argument':
        skip.update(id(n) for n in ast.walk(node))
  return [
    f'{path}:{node.lineno} {node.value!r}'
    for node in ast.walk(tree)
    if isinstance(node, ast.Constant)
    and isinstance(node.value, str)
    and id(node) not in skip
    and _HAND_SPELT.search(node.value)
  ]


def test_no_hint_under_lra_is_spelt_by_hand(tmp_path):
  bad = [
    b
    for p in sorted(pathlib.Path(ROOT, 'lra').rglob('*.py'))
    for b in (_hand_spelt(p))
  ]
  assert bad == []
  # The check itself sees a hand-spelt hint.
  (tmp_path / 'x.py').write_text(
    '"""python eval.py in a docstring is fine."""\n'
    "def f(w):\n  return f'curves: python eval.py --plot {w}'\n"
  )
  assert len(_hand_spelt(tmp_path / 'x.py')) == 1
