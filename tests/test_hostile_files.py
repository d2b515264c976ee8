"""Hostile input, round three (files): archives that would copy a sweep
into itself, damaged files a run wrote, read-only and full folders, a
damaged build cache.

Root ignores file permissions, so read-only folders are simulated where
the test runs as root: a write that raises EROFS (monkeypatched), the
error a read-only mount gives.
"""

import contextlib
import errno
import json
import os
import subprocess
import sys

from conftest import ROOT, tree
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


# --------------------------------------------- the built kernel's cache
MAMBA_SCAN = """
import jax, jax.numpy as jnp
from models.mixers import mamba
f = mamba.scan_for({kernel!r})
k = jax.random.split(jax.random.key(0), 4)
y = f(jax.random.normal(k[0], (16, 2, 8)),
      jax.nn.softplus(jax.random.normal(k[1], (16, 2, 8))),
      -jnp.ones((2, 4, 8)), jax.random.normal(k[2], (16, 2, 4)),
      jax.random.normal(k[3], (16, 2, 4)), 4)
print('native' if f is mamba.mamba_native.scan_time_major else 'xla',
      float(jnp.abs(y).sum()))
"""


def mamba_scan(cache, kernel='auto', **env):
  return subprocess.run(
    [sys.executable, '-c', MAMBA_SCAN.format(kernel=kernel)],
    cwd=ROOT, capture_output=True, text=True, timeout=600,
    env=dict(os.environ, LRA_CACHE_DIR=str(cache), JAX_PLATFORMS='cpu', **env),
  )  # fmt: skip


def test_a_truncated_kernel_in_the_build_cache_is_rebuilt(tmp_path):
  """A library cut short (a build stopped by a full disk, a copied cache)
  is never loaded (that is a Bus error): its checksum differs, it is
  rebuilt, and the scan gives the same numbers."""
  import shutil  # pylint: disable=g-import-not-at-top

  if not (shutil.which('c++') or shutil.which('g++')):
    pytest.skip('no C++ compiler here')
  first = mamba_scan(tmp_path)
  assert first.returncode == 0, first.stderr[-2000:]
  assert first.stdout.startswith('native'), first.stdout + first.stderr
  (library,) = tmp_path.glob('mamba_scan_*.so')
  assert (tmp_path / (library.name + '.sha256')).exists()
  size = library.stat().st_size
  with open(library, 'r+b') as f:
    f.truncate(size // 2)
  again = mamba_scan(tmp_path)
  assert again.returncode == 0, again.stderr[-2000:]
  assert again.stdout == first.stdout
  assert 'damaged or unchecked; rebuilding it' in again.stderr
  assert library.stat().st_size == size
  assert not list(tmp_path.glob('*.tmp')) and len(os.listdir(tmp_path)) == 2


def test_the_cache_loads_only_a_library_whose_checksum_matches(
  tmp_path, monkeypatch
):
  """_build returns a cached library without compiling only when its
  stamp matches; otherwise it compiles a fresh one (a fake compiler here)
  and writes library and stamp through renames."""
  from models.mixers import mamba_native  # pylint: disable=g-import-not-at-top

  monkeypatch.setenv('LRA_CACHE_DIR', str(tmp_path))
  monkeypatch.setenv('CXX', '/usr/bin/true')
  built = []

  def compiler(command, **kwargs):
    built.append(command)
    with open(command[command.index('-o') + 1], 'wb') as f:
      f.write(b'\x7fELF fresh library')
    return subprocess.CompletedProcess(command, 0, '', '')

  monkeypatch.setattr(mamba_native.subprocess, 'run', compiler)
  library = mamba_native._build()
  assert len(built) == 1 and library.read_bytes() == b'\x7fELF fresh library'
  assert mamba_native._build() == library and len(built) == 1  # checked, kept
  for damage in (b'\x7fELF fre', b'\x7fELF other library'):
    library.write_bytes(damage)  # truncated, then changed
    assert mamba_native._build() == library
    assert library.read_bytes() == b'\x7fELF fresh library'
  assert len(built) == 3
  os.remove(str(library) + '.sha256')  # an entry made before stamps
  mamba_native._build()
  assert len(built) == 4
  assert sorted(os.listdir(tmp_path)) == [
    library.name,
    library.name + '.sha256',
  ]


@pytest.mark.parametrize('kernel', ['auto', 'native'])
def test_without_a_compiler_auto_falls_back_in_one_line_native_refuses(
  tmp_path, kernel
):
  proc = mamba_scan(tmp_path, kernel, CXX=str(tmp_path / 'no-such-compiler'))
  lines = proc.stderr.strip().splitlines()
  if kernel == 'auto':
    assert proc.returncode == 0 and proc.stdout.startswith('xla'), proc.stderr
    said = [ln for ln in lines if 'mamba: the XLA scan is used' in ln]
    assert len(said) == 1, proc.stderr
  else:
    assert proc.returncode == 1  # a UserError raised in a bare script
    assert 'scan_kernel=native cannot run' in lines[-1]
    assert 'the XLA scan is used' not in proc.stderr
  assert not list(tmp_path.glob('*.so*'))


# ------------------------------------------- read-only runs, load_run
@contextlib.contextmanager
def read_only(folder):
  """`folder` made read-only for the block: chmod for a user; for root
  (who writes through any mode) a read-only bind mount of it, or a skip
  where mounting is not allowed."""
  folder = str(folder)
  if os.geteuid() != 0:
    modes = {}
    for d, _, files in os.walk(folder):
      for p in [d, *(os.path.join(d, f) for f in files)]:
        modes[p] = os.stat(p).st_mode
        os.chmod(p, modes[p] & ~0o222)
    try:
      yield folder
    finally:
      for p, mode in modes.items():
        os.chmod(p, mode)
    return
  mount = ['mount', '--bind', folder, folder]
  if subprocess.run(mount, capture_output=True).returncode:
    pytest.skip('root without mount: read-only cannot be simulated')
  try:
    ro = ['mount', '-o', 'remount,bind,ro', folder]
    if subprocess.run(ro, capture_output=True).returncode:
      pytest.skip('root without a read-only remount')
    yield folder
  finally:
    subprocess.run(['umount', folder], capture_output=True)


def test_load_run_of_a_read_only_run_writes_nothing(tmp_path, smoke_run):
  import shutil  # pylint: disable=g-import-not-at-top

  import numpy as np  # pylint: disable=g-import-not-at-top

  from lra import load_run  # pylint: disable=g-import-not-at-top

  workdir = tmp_path / 'run'
  shutil.copytree(smoke_run, workdir)
  before = tree(workdir)
  with read_only(workdir):
    with pytest.raises(OSError):
      (workdir / 'probe').write_text('x')
    run = load_run(str(workdir))
    logits = run.predict(np.array([[3, 4, 5, 6]]))
    assert logits.shape == (1, run.task.num_classes)
    assert np.isfinite(logits).all()
  assert tree(workdir) == before


def test_load_run_without_checkpoints_creates_none(tmp_path, smoke_run):
  import shutil  # pylint: disable=g-import-not-at-top

  from lra import load_run  # pylint: disable=g-import-not-at-top

  workdir = tmp_path / 'run'
  shutil.copytree(smoke_run, workdir)
  shutil.rmtree(workdir / 'checkpoints')
  with pytest.raises(UserError, match='has no best checkpoint'):
    load_run(str(workdir))
  assert not (workdir / 'checkpoints').exists()


@pytest.fixture(scope='module')
def loaded(smoke_run):
  from lra import load_run  # pylint: disable=g-import-not-at-top

  return load_run(smoke_run)


@pytest.mark.parametrize(
  'ids, says',
  [
    ([[3, 4, 200, 5]], 'token id 200 at [0, 2], outside the vocabulary'),
    ([[3, -1, 5]], 'token id -1 at [0, 1], outside the vocabulary'),
    ([[3, 4], [5, 70000]], 'token id 70000 at [1, 1]'),
    ([3, 4, 5], 'shape [batch, length], got shape (3,); add a batch axis'),
    ([[[3, 4]]], 'got shape (1, 1, 2)'),
    ([[1.5, 2.0]], 'integer token ids, got dtype float64'),
    ([[1, 2], [3]], 'an array it cannot read'),
    ([[]], 'empty batch'),
    ([[3] * 100000], 'longer than the run'),
  ],
)
def test_predict_refuses_ids_it_cannot_embed_in_one_sentence(loaded, ids, says):
  with pytest.raises(UserError) as e:
    loaded.predict(ids)
  assert says in str(e.value), str(e.value)
  if 'vocabulary' in says:
    vocab = loaded.task.vocab_size
    assert f'[0, {vocab})' in str(e.value)


def test_predict_takes_every_id_of_the_vocabulary(loaded):
  import numpy as np  # pylint: disable=g-import-not-at-top

  vocab = loaded.task.vocab_size
  ids = np.arange(vocab, dtype=np.int16)[None]
  assert np.isfinite(loaded.predict(ids)).all()


# ------------------------------------------- damaged files a run wrote
def damage(path, how):
  """Replaces the file at `path` by a damaged one: a directory in its
  place, binary bytes, JSON cut short, or valid JSON of the wrong type."""
  path = str(path)
  if os.path.isdir(path):
    import shutil  # pylint: disable=g-import-not-at-top

    shutil.rmtree(path)
  elif os.path.exists(path):
    with open(path, 'rb') as f:
      whole = f.read()
    os.remove(path)
  else:
    whole = b'{"step": 1, "split": "train", "loss": 1.0}\n' * 3
  if how == 'directory':
    os.makedirs(path)
    return
  data = {
    'binary': b'\x00\x9c\xff\xfe' + bytes(range(256)) * 4,
    'truncated': whole[: max(1, len(whole) // 2)],
    'wrong_type': b'[1, 2, 3]\n',
  }[how]
  with open(path, 'wb') as f:
    f.write(data)


DAMAGES = ['directory', 'binary', 'truncated', 'wrong_type']


@pytest.mark.parametrize('how', DAMAGES)
def test_load_json_names_the_file_and_the_damage(tmp_path, how):
  from lra.train import rundir  # pylint: disable=g-import-not-at-top

  path = tmp_path / 'results.json'
  path.write_text(json.dumps({'task': 'listops', 'test': {'accuracy': 0.5}}))
  damage(path, how)
  with pytest.raises(UserError) as e:
    rundir.load_json(str(path))
  said = str(e.value)
  assert said.startswith(f'{path} ') and '\n' not in said, said
  assert rundir.load_json(str(tmp_path / 'missing.json')) is None


@pytest.mark.parametrize('how', ['directory', 'binary', 'wrong_type'])
def test_a_metrics_log_that_is_none_is_one_sentence(tmp_path, how):
  from lra.train.metrics import read_rows  # pylint: disable=g-import-not-at-top

  path = tmp_path / 'metrics.jsonl'
  damage(path, how)
  if how == 'wrong_type':  # lines of JSON, none a row
    path.write_text('[1]\n"x"\n3\n')
  with pytest.raises(UserError) as e:
    read_rows(str(path))
  assert str(e.value).startswith(f'{path} '), str(e.value)


@pytest.mark.parametrize('how', DAMAGES)
def test_a_damaged_sweep_json_is_one_sentence_and_kept(tmp_path, how):
  from lra.sweep import runner  # pylint: disable=g-import-not-at-top

  os.makedirs(tmp_path / 'out')
  path = tmp_path / 'out' / 'sweep.json'
  path.write_text(json.dumps({'runs': [{'name': 'a', 'status': 'done'}]}))
  damage(path, how)
  before = tree(tmp_path / 'out')
  with pytest.raises(UserError) as e:
    runner.earlier_entries(str(tmp_path / 'out'))
  assert str(path) in str(e.value)
  with pytest.raises(UserError) as e:  # as the archive's --sweep or --out
    sweep_archive.archive(str(tmp_path / 'out'), str(tmp_path / 'arch'))
  assert str(path) in str(e.value) or 'no sweep.json with runs' in str(e.value)
  assert tree(tmp_path / 'out') == before


@pytest.mark.parametrize('how', DAMAGES)
def test_the_table_names_a_damaged_results_json(tmp_path, smoke_run, how):
  import shutil  # pylint: disable=g-import-not-at-top

  from lra.report import tables  # pylint: disable=g-import-not-at-top

  shutil.copytree(smoke_run, tmp_path / 'runs' / 'a')
  damage(tmp_path / 'runs' / 'a' / 'results.json', how)
  with pytest.raises(UserError) as e:
    tables.read_runs(str(tmp_path / 'runs'))
  assert str(tmp_path / 'runs' / 'a' / 'results.json') in str(e.value)


@pytest.mark.parametrize(
  'name, how',
  [
    ('config.json', 'directory'),
    ('config.json', 'binary'),
    ('metrics.jsonl', 'binary'),
    ('metrics.jsonl', 'directory'),
    ('results.json', 'truncated'),
  ],
)
def test_a_resume_over_a_damaged_file_is_one_sentence_and_keeps_it(
  tmp_path, smoke_run, smoke_data_dir, name, how
):
  import shutil  # pylint: disable=g-import-not-at-top

  from conftest import SMOKE  # pylint: disable=g-import-not-at-top

  workdir = tmp_path / 'run'
  shutil.copytree(smoke_run, workdir)
  if name != 'results.json':
    os.remove(workdir / 'results.json')  # a run to resume, not finished
  damage(workdir / name, how)
  before = tree(workdir / 'checkpoints')
  damaged = (
    tree(workdir / name)
    if how == 'directory'
    else (workdir / name).read_bytes()
  )
  proc = run_module(
    'train.py', f'--config={SMOKE}', f'--workdir={workdir}',
    f'--config.data_dir={smoke_data_dir}', timeout=300,
  )  # fmt: skip
  assert proc.returncode == 2, proc.stderr[-3000:]
  assert 'Traceback' not in proc.stderr
  line = proc.stderr.strip().splitlines()[-1]
  assert line.startswith('error: ') and str(workdir / name) in line, line
  assert tree(workdir / 'checkpoints') == before
  after = (
    tree(workdir / name)
    if how == 'directory'
    else (workdir / name).read_bytes()
  )
  assert after == damaged


# --------------------------------------------- prepare on a full disk
def test_prepare_on_a_full_disk_is_one_sentence_and_leaves_no_tmp(
  tmp_path, monkeypatch, capsys
):
  import numpy as np  # pylint: disable=g-import-not-at-top

  from lra.data import cache, prepare  # pylint: disable=g-import-not-at-top

  real_save = np.save

  def full(file, arr, *args, **kwargs):
    file.write(b'\x93NUMPY' + b'\0' * 4096)  # part of it, then the disk fills
    raise OSError(errno.ENOSPC, 'No space left on device')

  monkeypatch.setattr(cache.np, 'save', full)
  code = prepare.main(['listops', '--small', f'--data_dir={tmp_path}'])
  monkeypatch.setattr(cache.np, 'save', real_save)
  assert code == 2
  (line,) = capsys.readouterr().err.strip().splitlines()[-1:]
  assert line.startswith('error: ') and 'no space left on device' in line
  assert 'free some space' in line
  left = [str(p) for p in tmp_path.rglob('*') if '.tmp' in p.name]
  assert not left, left
  assert not [p for p in tmp_path.rglob('*.lock')]


def test_prepare_on_a_real_full_file_system(tmp_path):
  """The same on a 2 MB tmpfs where this may mount one (root): the error
  comes from the kernel, wherever the generator is writing."""
  disk = tmp_path / 'disk'
  disk.mkdir()
  mount = ['mount', '-t', 'tmpfs', '-o', 'size=2m', 'tmpfs', str(disk)]
  if os.geteuid() != 0 or subprocess.run(mount, capture_output=True).returncode:
    pytest.skip('cannot mount a small file system here')
  try:
    proc = run_module(
      '-m',
      'lra.data.prepare',
      'listops',
      '--small',
      f'--data_dir={disk}',
      timeout=600,
    )
    line = one_error_line_last(proc)
    assert 'no space left on device' in line
    assert not [p for p in disk.rglob('*') if '.tmp' in p.name]
  finally:
    subprocess.run(['umount', str(disk)], capture_output=True)


def one_error_line_last(proc):
  """The last line of a refused command (exit 2, no traceback); progress
  lines may come before it."""
  assert proc.returncode == 2, (proc.returncode, proc.stderr[-3000:])
  assert 'Traceback' not in proc.stderr, proc.stderr[-3000:]
  line = proc.stderr.strip().splitlines()[-1]
  assert line.startswith('error: '), line
  return line
