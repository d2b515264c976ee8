"""python -m lra.data.prepare <task> --download against a loopback HTTP server.

The server (127.0.0.1, an ephemeral port, given as --mirror) serves fixture
archives in the release formats (tests/release_fixtures.py), honours Range
requests and can cut a response short; no test reaches the internet.
"""

import dataclasses
import hashlib
import http.server
import io
import os
import socket
import sys
import tarfile
import threading
import types

import pytest
import release_fixtures as fx

from lra.data import download, prepare, release
from lra.errors import UserError


class _Handler(http.server.BaseHTTPRequestHandler):
  files = {}  # name -> bytes
  log = []  # (path, Range header or None)
  cut_after = []  # a byte count: the next response stops after it

  def log_message(self, *args):
    del args

  def do_GET(self):
    name = self.path.lstrip('/')
    self.log.append((name, self.headers.get('Range')))
    if name not in self.files:
      self.send_error(404)
      return
    data = self.files[name]
    start = 0
    if self.headers.get('Range'):
      start = int(self.headers['Range'].split('=')[1].split('-')[0])
      if start >= len(data):
        self.send_error(416)
        return
      self.send_response(206)
      self.send_header(
        'Content-Range', f'bytes {start}-{len(data) - 1}/{len(data)}'
      )
    else:
      self.send_response(200)
    self.send_header('Content-Length', str(len(data) - start))
    self.end_headers()
    body = data[start:]
    if self.cut_after:
      body = body[: self.cut_after.pop()]
    self.wfile.write(body)
    self.wfile.flush()
    self.close_connection = True


@pytest.fixture(autouse=True)
def _no_user_tfds(monkeypatch, tmp_path):
  fx.isolate_tfds(monkeypatch, tmp_path)


@pytest.fixture(scope='module')
def server():
  httpd = http.server.ThreadingHTTPServer(('127.0.0.1', 0), _Handler)
  thread = threading.Thread(
    target=httpd.serve_forever, args=(0.05,), daemon=True
  )
  thread.start()
  yield f'http://127.0.0.1:{httpd.server_address[1]}'
  httpd.shutdown()
  httpd.server_close()


@pytest.fixture
def served(server, monkeypatch):
  """Serves {name: bytes}; the download's known checks become theirs."""
  _Handler.log.clear()
  _Handler.cut_after.clear()

  def serve(key, data, **checks):
    src = download.SOURCES[key]
    _Handler.files[src.name] = data
    known = dict(size=len(data), sha256=hashlib.sha256(data).hexdigest())
    if src.md5:
      known['md5'] = hashlib.md5(data).hexdigest()
    known.update(checks)
    monkeypatch.setitem(
      download.SOURCES, key, dataclasses.replace(src, **known)
    )
    return download.SOURCES[key]

  return serve


def _bytes(write, tmp_path):
  with open(write(str(tmp_path / 'made')), 'rb') as f:
    return f.read()


def test_download_text_then_prepare(tmp_path, server, served, capsys):
  data = _bytes(lambda d: fx.write_aclimdb_tar(d), tmp_path)
  served('imdb', data)
  d = str(tmp_path / 'data')
  args = ['text', '--data_dir', d, '--download', '--mirror', server]
  assert prepare.main(args) == 0
  with open(os.path.join(d, 'text', 'aclImdb_v1.tar.gz'), 'rb') as f:
    assert f.read() == data
  out = capsys.readouterr().out
  assert 'text: prepared in' in out and 'train 16' in out
  # A second run finds the file checked and in place: no request.
  _Handler.log.clear()
  assert prepare.main(args) == 0
  assert _Handler.log == []


def test_resume_after_cut_and_from_part_file(tmp_path, server, served):
  data = _bytes(lambda d: fx.write_cifar_tar(d), tmp_path)
  assert len(data) > 10_000
  src = served('cifar10', data)
  dest = str(tmp_path / 'image' / src.name)
  # The first response stops after 4,000 bytes: the next asks for the rest.
  _Handler.cut_after.append(4000)
  download.fetch(src, dest, mirror=server, progress=False)
  assert _Handler.log == [(src.name, None), (src.name, 'bytes=4000-')]
  with open(dest, 'rb') as f:
    assert f.read() == data
  # A .part left by an earlier command is continued, not restarted.
  os.remove(dest)
  with open(dest + '.part', 'wb') as f:
    f.write(data[:7000])
  _Handler.log.clear()
  download.fetch(src, dest, mirror=server, progress=False)
  assert _Handler.log == [(src.name, 'bytes=7000-')]
  with open(dest, 'rb') as f:
    assert f.read() == data
  assert not os.path.exists(dest + '.part')


def test_checksum_mismatch_keeps_the_file_aside(tmp_path, server, served):
  data = _bytes(lambda d: fx.write_aclimdb_tar(d), tmp_path)
  src = served('imdb', data, sha256='0' * 64)
  dest = str(tmp_path / 'text' / src.name)
  with pytest.raises(UserError) as e:
    download.fetch(src, dest, mirror=server, progress=False)
  msg = str(e.value)
  assert 'SHA-256' in msg and dest + '.bad' in msg and '\n' not in msg
  assert msg.endswith('.') and msg.count('. ') == 0
  assert not os.path.exists(dest) and not os.path.exists(dest + '.part')
  with open(dest + '.bad', 'rb') as f:
    assert f.read() == data
  # A wrong size is caught before any digest.
  src = served('imdb', data, size=len(data) + 1)
  with pytest.raises(UserError, match='expected'):
    download.fetch(src, dest, mirror=server, progress=False)


def test_unreachable_host_says_where_to_put_the_file(tmp_path, capsys):
  with socket.socket() as s:  # a port nobody listens on
    s.bind(('127.0.0.1', 0))
    port = s.getsockname()[1]
  d = str(tmp_path / 'data')
  mirror = f'http://127.0.0.1:{port}'
  assert (
    prepare.main(['image', '--data_dir', d, '--download', '--mirror', mirror])
    == 2
  )
  err = capsys.readouterr().err.strip()
  dest = os.path.join(d, 'image', 'cifar-10-python.tar.gz')
  assert err.startswith('error: Cannot download') and '\n' not in err
  assert f'put it at {dest}' in err


def _release_archive(tmp_path):
  """lra_release.gz as released (members under lra_release/lra_release/):
  AAN TSVs, two Pathfinder-32 difficulties and ListOps."""
  scratch = str(tmp_path / 'scratch')
  fx.write_aan_tsv(os.path.join(scratch, 'tsv_data'))
  fx.write_pathfinder_release(scratch, folder='curv_baseline', n=20)
  fx.write_pathfinder_release(scratch, folder='curv_contour_length_14', n=20)
  buf = io.BytesIO()
  with tarfile.open(fileobj=buf, mode='w:gz') as tar:
    tar.add(
      os.path.join(scratch, 'tsv_data'), 'lra_release/lra_release/tsv_data'
    )
    tar.add(
      os.path.join(scratch, 'pathfinder', 'release', 'pathfinder32'),
      'lra_release/lra_release/pathfinder32',
    )
    info = tarfile.TarInfo('lra_release/lra_release/listops-1000/basic_val.tsv')
    rows = b'Source\tTarget\n( [MAX 2 ] )\t2\n'
    info.size = len(rows)
    tar.addfile(info, io.BytesIO(rows))
  return buf.getvalue()


def test_release_archive_extracts_only_what_the_task_needs(
  tmp_path, server, served, capsys
):
  served('lra_release', _release_archive(tmp_path))
  d = str(tmp_path / 'data')
  base = ['--data_dir', d, '--download', '--mirror', server]
  assert prepare.main(['retrieval'] + base) == 0
  assert sorted(os.listdir(os.path.join(d, 'retrieval'))) == [
    'aan',
    'new_aan_pairs.eval.tsv',
    'new_aan_pairs.test.tsv',
    'new_aan_pairs.train.tsv',
  ]
  assert len(_Handler.log) == 1
  args = ['pathfinder', '--option', 'difficulty=easy'] + base
  assert prepare.main(args) == 0
  assert len(_Handler.log) == 1  # the kept archive is read again
  release = os.path.join(d, 'pathfinder', 'release', 'pathfinder32')
  assert os.listdir(release) == ['curv_baseline']
  assert not os.path.exists(os.path.join(d, 'listops'))
  out = capsys.readouterr().out
  assert '32_easy_release' in out and 'train 16' in out


def _fake_tfds(monkeypatch, write=None, error=None):
  """Stand-ins for the packages --source tfds imports: a
  tensorflow_datasets whose builder records its calls and writes what TFDS
  would (`write(data_dir)`) or raises `error`. Returns the calls."""
  calls = []

  def builder(name, data_dir):
    def download_and_prepare():
      calls.append((name, data_dir))
      if error is not None:
        raise error
      if write is not None:
        write(data_dir)

    return types.SimpleNamespace(download_and_prepare=download_and_prepare)

  fake = types.SimpleNamespace(builder=builder)
  monkeypatch.setitem(sys.modules, 'tensorflow_datasets', fake)
  monkeypatch.setitem(sys.modules, 'tensorflow', types.SimpleNamespace())
  monkeypatch.setitem(
    sys.modules, 'importlib_resources', types.SimpleNamespace()
  )
  return calls


def _tfds(task, d, capsys):
  """Runs prepare TASK --download --source tfds: (exit code, out, err)."""
  code = prepare.main([task, '--data_dir', d, '--download', '--source', 'tfds'])
  out, err = capsys.readouterr()
  return code, out, err


def test_source_tfds_names_missing_packages(tmp_path, monkeypatch, capsys):
  d = str(tmp_path / 'data')
  for module in ('tensorflow_datasets', 'tensorflow', 'importlib_resources'):
    monkeypatch.setitem(sys.modules, module, None)
  code, out, err = _tfds('text', d, capsys)
  assert code == 2 and out == ''
  err = err.strip()
  assert '\n' not in err and 'Traceback' not in err
  assert err.startswith(
    'error: --source tfds needs tensorflow-datasets, tensorflow-cpu and '
    'importlib_resources, which are not installed:'
  )
  assert "pip install -e '.[tfds]'" in err
  assert (
    'pip install tensorflow-datasets tensorflow-cpu importlib_resources' in err
  )
  assert 'fetch aclImdb_v1.tar.gz' in err and 'No IMDB source' not in err
  # tensorflow-datasets 4.9 imports importlib_resources undeclared.
  _fake_tfds(monkeypatch)
  monkeypatch.setitem(sys.modules, 'importlib_resources', None)
  code, _, err = _tfds('image', d, capsys)
  assert code == 2
  assert 'needs importlib_resources, which is not installed' in err
  assert 'fetch cifar-10-python.tar.gz' in err


def test_source_tfds_downloads_once_into_the_default(
  tmp_path, monkeypatch, capsys
):
  d = str(tmp_path / 'data')
  calls = _fake_tfds(
    monkeypatch, write=lambda root: fx.write_tfds_imdb(os.path.dirname(root))
  )
  root = os.path.join(d, 'text', 'tensorflow_datasets')
  code, out, _ = _tfds('text', d, capsys)
  assert code == 0
  assert calls == [('imdb_reviews/plain_text', root)]
  assert f'TFDS imdb_reviews downloaded and prepared in {root}' in out
  assert 'text: prepared in' in out
  assert f'from tfds {root}/imdb_reviews/plain_text/1.0.0' in out
  # Prepared there: the next command reads it in place, TFDS untouched.
  code, out, _ = _tfds('text', d, capsys)
  assert code == 0 and len(calls) == 1
  assert f'TFDS imdb_reviews already prepared in {root}' in out
  assert 'nothing fetched' in out and 'text: already prepared in' in out
  # An archive beside it: auto prefers it, and the output says so.
  fx.write_aclimdb_tar(os.path.join(d, 'text'))
  assert prepare.main(['text', '--data_dir', d, '--force']) == 0
  code, out, _ = _tfds('text', d, capsys)
  assert code == 0 and len(calls) == 1
  assert 'takes the archive before TFDS; add --option source=tfds' in out
  # With source=tfds the cache is TFDS's.
  args = ['text', '--data_dir', d, '--download', '--source', 'tfds']
  assert prepare.main(args + ['--option', 'source=tfds']) == 0
  out = capsys.readouterr().out
  assert 'val_test_tfds' in out and 'takes the' not in out
  assert (
    prepare.main(
      ['retrieval', '--data_dir', d, '--download', '--source', 'tfds']
    )
    == 2
  )


def test_source_tfds_uses_tfds_data_dirs(tmp_path, monkeypatch, capsys):
  d = str(tmp_path / 'data')
  # $TFDS_DATA_DIR holding a prepared copy: read in place, no TFDS needed.
  env = str(tmp_path / 'env' / 'tensorflow_datasets')
  fx.write_tfds_cifar(tmp_path / 'env', n_per_batch=4)
  monkeypatch.setenv('TFDS_DATA_DIR', env)
  for module in ('tensorflow_datasets', 'tensorflow', 'importlib_resources'):
    monkeypatch.setitem(sys.modules, module, None)
  code, out, _ = _tfds('image', d, capsys)
  assert code == 0
  assert f'TFDS cifar10 already prepared in {env} (from $TFDS_DATA_DIR)' in out
  assert f'from tfds {env}/cifar10/3.0.2' in out
  assert not os.path.exists(os.path.join(d, 'image', 'tensorflow_datasets'))
  # $TFDS_DATA_DIR without it: TFDS prepares it there.
  calls = _fake_tfds(
    monkeypatch, write=lambda root: fx.write_tfds_imdb(tmp_path / 'made')
  )
  code, _, err = _tfds('text', d, capsys)
  assert calls == [('imdb_reviews/plain_text', env)]
  # (this stand-in wrote elsewhere: one sentence, not "No IMDB source")
  assert code == 2
  err = err.strip()
  assert err.startswith(
    'error: TensorFlow Datasets prepared imdb_reviews/plain_text but '
    f'{env} holds no imdb_reviews/plain_text/<version>/ with '
    'dataset_info.json'
  )
  assert '\n' not in err and 'No IMDB source' not in err
  # No $TFDS_DATA_DIR: ~/tensorflow_datasets when it holds the dataset.
  monkeypatch.delenv('TFDS_DATA_DIR')
  home = release.home_tfds_dir()
  fx.write_tfds_imdb(os.path.dirname(home), n_per_class=2)
  code, out, _ = _tfds('text', d, capsys)
  assert code == 0 and len(calls) == 1
  assert f'TFDS imdb_reviews already prepared in {home}' in out
  assert 'train 4' in out


def test_source_tfds_failure_is_one_sentence(tmp_path, monkeypatch, capsys):
  d = str(tmp_path / 'data')
  error = ConnectionError('Failed to resolve host\n  (a long trace)')
  calls = _fake_tfds(monkeypatch, error=error)
  code, out, err = _tfds('image', d, capsys)
  assert code == 2 and len(calls) == 1
  err = err.strip()
  root = os.path.join(d, 'image', 'tensorflow_datasets')
  assert err == (
    'error: TensorFlow Datasets could not download and prepare cifar10 in '
    f'{root} (ConnectionError: Failed to resolve host); check the network '
    'and run the same command again, or drop --source tfds to fetch '
    'cifar-10-python.tar.gz.'
  )
  assert 'No CIFAR-10 source' not in out + err
