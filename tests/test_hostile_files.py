"""Hostile input, round three (files): archives that would copy a sweep
into itself, damaged files a run wrote, read-only and full folders, a
damaged build cache.

Root ignores file permissions, so read-only folders are simulated where
the test runs as root: a write that raises EROFS (monkeypatched), the
error a read-only mount gives.
"""

import errno
import json
import os
import subprocess
import sys

from conftest import ROOT
import pytest
from test_sweep_archive import write_sweep

from lra.errors import UserError
from lra.sweep import archive as sweep_archive


def run_module(*args, timeout=120):
  return subprocess.run(
    [sys.executable, *args], cwd=ROOT, capture_output=True, text=True,
    timeout=timeout,
  )  # fmt: skip


def one_error_line(proc):
  """The single `error:` line of a refused command (exit 2, no traceback)."""
  assert proc.returncode == 2, (proc.returncode, proc.stderr[-3000:])
  assert 'Traceback' not in proc.stderr, proc.stderr[-3000:]
  (line,) = proc.stderr.strip().splitlines()
  assert line.startswith('error: '), line
  return line


def tree(folder):
  """{relative path: bytes} of every file below `folder`."""
  out = {}
  for d, _, files in os.walk(folder):
    for f in files:
      path = os.path.join(d, f)
      with open(path, 'rb') as fh:
        out[os.path.relpath(path, folder)] = fh.read()
  return out


# ------------------------------------------------------------- archives
@pytest.mark.parametrize(
  'out',
  ['link', 'runs/a', 'runs/a/archive', 'runs/a/mqar', 'runs', '.', 'linkdir'],
)
def test_an_archive_into_its_own_sweep_is_refused_and_touches_nothing(
  tmp_path, monkeypatch, out
):
  monkeypatch.chdir(tmp_path)
  write_sweep('runs/a', [('1e-3', 0.5, 0.45), ('1e-2', 0.9, 0.88)], 'cmd')
  os.symlink('runs/a', 'link')  # the sweep reached through a link
  os.symlink('runs', 'linkdir')  # a folder holding it, through a link
  before = tree('runs')
  with pytest.raises(UserError) as e:
    sweep_archive.archive('runs/a', out)
  assert 'give another --out' in str(e.value) or 'outside' in str(e.value)
  assert tree('runs') == before
  assert not os.path.exists('runs/a/archive')


def test_an_archive_onto_a_run_folder_elsewhere_is_refused(
  tmp_path, monkeypatch
):
  """The sweep's runs lie outside its --out folder (workdirs relative to
  where it ran): an --out that holds them is refused too."""
  monkeypatch.chdir(tmp_path)
  write_sweep('runs/a', [('1e-3', 0.5, 0.45)], 'cmd')
  with open('runs/a/sweep.json') as f:
    data = json.load(f)
  os.makedirs('elsewhere')
  os.rename('runs/a/mqar', 'elsewhere/mqar')
  for e in data['runs']:
    e['workdir'] = os.path.join(str(tmp_path), 'elsewhere', e['name'])
  with open('runs/a/sweep.json', 'w') as f:
    json.dump(data, f)
  before = tree('elsewhere')
  with pytest.raises(UserError, match='its own run folder'):
    sweep_archive.archive('runs/a', 'elsewhere')
  assert tree('elsewhere') == before


def test_archive_through_the_command_line_into_a_link_is_one_line(tmp_path):
  sweep = tmp_path / 'runs' / 'a'
  os.makedirs(sweep.parent)
  cwd = os.getcwd()
  os.chdir(tmp_path)
  try:
    write_sweep('runs/a', [('1e-3', 0.5, 0.45)], 'cmd')
  finally:
    os.chdir(cwd)
  # The entries' workdirs are relative to tmp_path: make them absolute.
  data = json.loads((sweep / 'sweep.json').read_text())
  for e in data['runs']:
    e['workdir'] = str(tmp_path / e['workdir'])
  (sweep / 'sweep.json').write_text(json.dumps(data))
  os.symlink(sweep, tmp_path / 'link')
  before = tree(sweep)
  proc = run_module(
    '-m', 'lra.sweep.archive', f'--sweep={sweep}', f'--out={tmp_path}/link'
  )
  line = one_error_line(proc)
  assert 'give another --out' in line
  assert tree(sweep) == before and len(before) > 5


def test_archive_into_a_read_only_folder_is_one_sentence(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  write_sweep('runs/a', [('1e-3', 0.5, 0.45)], 'cmd')
  sweep_archive.archive('runs/a', 'docs/a')
  before = tree('docs/a')
  if os.geteuid() == 0:  # root writes anywhere: a read-only mount's error
    import tempfile  # pylint: disable=g-import-not-at-top

    def read_only(*args, **kwargs):
      raise OSError(errno.EROFS, 'Read-only file system')

    monkeypatch.setattr(tempfile, 'mkstemp', read_only)
  else:
    os.chmod('docs/a', 0o555)
  try:
    with pytest.raises(UserError, match='cannot write the archive') as e:
      sweep_archive.archive('runs/a', 'docs/a')
  finally:
    os.chmod('docs/a', 0o755)
  assert 'docs/a' in str(e.value)
  assert tree('docs/a') == before


def test_archive_stopped_by_a_full_disk_keeps_each_run_whole(
  tmp_path, monkeypatch
):
  import shutil  # pylint: disable=g-import-not-at-top

  monkeypatch.chdir(tmp_path)
  write_sweep('runs/a', [('1e-3', 0.5, 0.45), ('1e-2', 0.9, 0.88)], 'cmd')
  sweep_archive.archive('runs/a', 'docs/a')
  before = tree('docs/a')
  copy = shutil.copy2
  calls = []

  def full(src, dst, **kwargs):
    calls.append(src)
    if len(calls) > 3:
      raise OSError(errno.ENOSPC, 'No space left on device', dst)
    return copy(src, dst, **kwargs)

  monkeypatch.setattr(shutil, 'copy2', full)
  with pytest.raises(UserError, match='No space left on device') as e:
    sweep_archive.archive('runs/a', 'docs/a')
  assert 'run the same command again' in str(e.value)
  after = tree('docs/a')
  assert after == before
