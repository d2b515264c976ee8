"""Every committed figure can be redrawn: docs/figures.md names its command
and its committed inputs, and those inputs exist (issue 52)."""

import os
import re
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MANIFEST = 'docs/figures.md'
# Folders of a working copy that hold a user's outputs, not the project's.
NOT_PROJECT = {'.git', '.venv', 'venv', 'runs', 'build', 'node_modules'}
CELL = re.compile(r'`([^`]+)`')


def manifest(text):
  """{figure path: (command, [input paths])} from the manifest's table
  rows ('| `figure` | `command` | `input` ... or none: ... |')."""
  out = {}
  for line in text.splitlines():
    cells = [c.strip() for c in line.strip().strip('|').split('|')]
    if len(cells) != 3 or not cells[0].startswith('`'):
      continue
    figure = CELL.findall(cells[0])[0]
    command = CELL.findall(cells[1])
    inputs = [] if cells[2].startswith('none') else CELL.findall(cells[2])
    out[figure] = (command[0] if command else '', inputs)
  return out


def committed_figures():
  """The repository's .png files: git's list in a clone, else the files
  below the root outside a user's run folders."""
  if os.path.isdir(os.path.join(ROOT, '.git')):
    proc = subprocess.run(
      ['git', 'ls-files', '*.png'],
      cwd=ROOT,
      capture_output=True,
      text=True,
      check=True,
    )
    return sorted(p for p in proc.stdout.split() if p)
  found = []
  for d, dirs, files in os.walk(ROOT):
    dirs[:] = [x for x in dirs if x not in NOT_PROJECT]
    for f in files:
      if f.endswith('.png'):
        found.append(os.path.relpath(os.path.join(d, f), ROOT))
  return sorted(found)


def test_the_manifest_is_read_as_written():
  text = (
    '| figure | command | inputs |\n|---|---|---|\n'
    '| `a/x.png` | `python -m m --out a` | `a/runs`, `a/b.json` |\n'
    '| `y.png` | `python -m n --examples y.png` | none: generated |\n'
  )
  assert manifest(text) == {
    'a/x.png': ('python -m m --out a', ['a/runs', 'a/b.json']),
    'y.png': ('python -m n --examples y.png', []),
  }


def test_every_committed_figure_has_a_command_and_existing_inputs():
  with open(os.path.join(ROOT, MANIFEST)) as f:
    listed = manifest(f.read())
  figures = committed_figures()
  assert figures, 'no figure found'
  unlisted = [p for p in figures if p not in listed]
  assert not unlisted, f'figures missing from {MANIFEST}: {unlisted}'
  for figure, (command, inputs) in listed.items():
    assert os.path.isfile(os.path.join(ROOT, figure)), f'{figure} is listed but absent'
    assert command.startswith('python '), (figure, command)
    # The command writes this figure: its file or its folder is named.
    assert os.path.dirname(figure) in command or figure in command, (
      figure,
      command,
    )
    for path in inputs:
      assert os.path.exists(os.path.join(ROOT, path)), (
        f'{figure}: input {path} is not in the repository'
      )
