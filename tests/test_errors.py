"""Every error a user can cause: one sentence on stderr, exit 2, no trace,
nothing written; damaged checkpoints and caches: a warned fallback.

The table runs each case's command line as `python <args>` would, in a
forked child of one process that imported the project once
(tests/forkrun.py: most of a plain subprocess's cost is importing JAX), two
at a time, against a finished smoke run and its data cache, and checks that
none of their files changed and no fresh workdir appeared.
"""

import hashlib
import json
import os
import shutil
import subprocess
import sys
import types

import numpy as np
import pytest

from lra.data import cache
from lra.errors import UserError
from lra.train import validate

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMOKE = 'configs/listops.py:transformer,smoke'
TRAIN = ('train.py', f'--config={SMOKE}')
BENCH = ('benchmark.py', '--preset=tiny')
PREPARE = ('-m', 'lra.data.prepare')

# (id, command, match in the error line). Placeholders: {run} a finished
# smoke run, {data} its data root, {fresh} a path that must stay absent,
# {file} a regular file, {tmp} a scratch folder, {empty_tsv} / {bad_tsv} /
# {bad_cache} data roots with a header-only release TSV, a malformed one,
# a truncated Text cache, {bad_ckpt} a run whose checkpoints are damaged.
CASES = [
  # config values
  ('steps_0', (*TRAIN, '--config.num_train_steps=0'), 'num_train_steps=0 is'),
  ('steps_neg', (*TRAIN, '--config.num_train_steps=-3'), '>= 1'),
  ('batch_0', (*TRAIN, '--config.batch_size=0'), '--config.batch_size=0 is'),
  ('eval_every_0', (*TRAIN, '--config.eval_every_steps=0'), 'eval_every'),
  ('log_every_0', (*TRAIN, '--config.log_every_steps=0'), 'log_every'),
  ('ckpt_every_0', (*TRAIN, '--config.checkpoint_every_steps=0'), '>= 1'),
  ('keep_0', (*TRAIN, '--config.keep_checkpoints=0'), 'keep_checkpoints'),
  ('max_length_neg', (*TRAIN, '--config.max_length=-5'), 'max_length=-5'),
  ('max_length_0', (*TRAIN, '--config.max_length=0'), 'max_length=0 is'),
  (
    'pixel_length',
    (
      'train.py',
      '--config=configs/pathfinder.py:transformer,smoke',
      '--config.max_length=2000',
    ),
    'use --config.max_length=1024',
  ),
  ('heads_3', (*TRAIN, '--config.model.num_heads=3'), 'does not divide'),
  ('dropout_1', (*TRAIN, '--config.model.dropout_rate=1.0'), '[0, 1)'),
  ('lr_neg', (*TRAIN, '--config.learning_rate=-1'), 'learning_rate=-1'),
  ('schedule', (*TRAIN, '--config.schedule=linear'), 'not one of rsqrt'),
  # flags and choices (handled before this table)
  ('typo', (*TRAIN, '--config.modle.num_layers=2'), "config key 'modle'"),
  ('typo_leaf', (*TRAIN, '--config.model.num_layerz=2'), "'num_layers'?"),
  ('not_int', (*TRAIN, '--config.batch_size=abc'), 'batch_size'),
  ('task', (*TRAIN, '--config.task=nope'), 'known tasks: listops, text'),
  ('devices', (*TRAIN, '--config.batch_size=6'), 'divisible by the 4'),
  ('dtype', (*TRAIN, '--config.dtype=float16'), 'use float32 or bfloat16'),
  ('pooling', (*TRAIN, '--config.model.pooling=sum'), 'Unknown pooling'),
  (
    'attention_key',
    (*TRAIN, '--config.model.attention.window=3'),
    "softmax has no option 'window'; its options: implementation=einsum",
  ),
  (
    'model',
    ('train.py', '--config=configs/listops.py:nope'),
    'known models: transformer',
  ),
  (
    'config_file',
    ('train.py', '--config=configs/nope.py:transformer'),
    'configs/listops.py',
  ),
  # paths
  ('workdir_in_file', (*TRAIN, '--workdir={file}/run'), 'is a file'),
  ('workdir_long', (*TRAIN, '--workdir={tmp}/' + 'w' * 300), 'shorter name'),
  ('data_dir_in_file', (*TRAIN, '--config.data_dir={file}/d'), 'is a file'),
  ('env_data_dir_in_file', TRAIN, 'LRA_DATA_DIR'),
  ('bench_out_in_file', (*BENCH, '--out={file}/b'), '--out'),
  ('prepare_in_file', (*PREPARE, 'listops', '--data_dir={file}/d'), 'file'),
  # benchmark flags
  (
    'bench_no_model',
    (*BENCH, '--models=-transformer,-transformer_fused', '--out={fresh}'),
    'leaves no model',
  ),
  ('bench_length_0', (*BENCH, '--lengths=0', '--out={fresh}'), '--lengths'),
  # data
  ('prepare_task', (*PREPARE, 'nope'), 'known tasks'),
  (
    'empty_split',
    (*PREPARE, 'listops', '--data_dir={empty_tsv}'),
    'basic_val.tsv has no examples',
  ),
  (
    'malformed_tsv',
    (*TRAIN, '--config.data.variant=full', '--config.data_dir={bad_tsv}'),
    'basic_train.tsv, line 5',
  ),
  (
    'missing_text',
    (
      'train.py',
      '--config=configs/text.py:transformer,smoke',
      '--config.data_dir={tmp}/nodata',
    ),
    'aclImdb_v1.tar.gz',
  ),
  (
    'truncated_cache',
    (
      'train.py',
      '--config=configs/text.py:transformer,smoke',
      '--config.data_dir={bad_cache}',
    ),
    'python -m lra.data.prepare text --data_dir',
  ),
  (
    'truncated_cache_prepare',
    (*PREPARE, 'text', '--data_dir={bad_cache}', '--option=val=heldout'),
    '--force',
  ),
  # eval
  ('eval_no_run', ('eval.py', '--workdir={tmp}'), 'config.json does not'),
  (
    'eval_bad_ckpt',
    ('eval.py', '--workdir={bad_ckpt}', '--split=val'),
    'is incomplete (meta/metadata is missing); evaluate another',
  ),
]
# Cases that name no --workdir get one: the finished run (whose files must
# not change) or, for these, a fresh path (which must not be created).
FRESH_WORKDIR = {
  'steps_0',
  'batch_0',
  'heads_3',
  'max_length_0',
  'model',
  'malformed_tsv',
  'missing_text',
  'truncated_cache',
}


def digest(root):
  out = {}
  for folder, _, names in os.walk(root):
    for name in names:
      path = os.path.join(folder, name)
      with open(path, 'rb') as f:
        out[os.path.relpath(path, root)] = hashlib.sha1(f.read()).hexdigest()
  return out


def truncate(path, keep=0.5):
  size = os.path.getsize(path)
  with open(path, 'r+b') as f:
    f.truncate(int(size * keep))


def array_files(step_dir):
  """The array data files of a save (OCDBT 'd/' folders under state/)."""
  return [
    os.path.join(folder, name)
    for folder, _, names in os.walk(os.path.join(step_dir, 'state'))
    if os.path.basename(folder) == 'd'
    for name in names
  ]


def write_tsvs(folder, train_extra='', val_rows=3):
  os.makedirs(folder)
  good = '( ( ( [MAX 2 ) 9 ) ] )\t9\n'
  for split in ('train', 'val', 'test'):
    body = 'Source\tTarget\n'
    body += good * (val_rows if split == 'val' else 3)
    if split == 'train':
      body += train_extra
    with open(os.path.join(folder, f'basic_{split}.tsv'), 'w') as f:
      f.write(body)


def text_cache(data_dir):
  """A small Text cache (val=heldout, as the smoke preset reads) with its
  train inputs truncated."""
  path = os.path.join(data_dir, 'text', 'val_heldout')
  rng = np.random.default_rng(0)
  for split in cache.SPLITS:
    inputs = rng.integers(1, 257, (16, 4000)).astype(np.int16)
    cache.save_split(path, split, inputs, rng.integers(0, 2, 16))
  truncate(os.path.join(path, 'train_inputs.npy'))
  return data_dir


def damaged_run(run, dest):
  shutil.copytree(run, dest)
  for which in ('latest', 'best'):
    for step in os.listdir(os.path.join(dest, 'checkpoints', which)):
      shutil.rmtree(os.path.join(dest, 'checkpoints', which, step, 'meta'))
  return dest


def expand(command, places, case_id):
  args = [a.format(**places) for a in command]
  if args[0] == 'train.py' and not any(a.startswith('--workdir') for a in args):
    fresh = case_id in FRESH_WORKDIR
    args.append(f'--workdir={places["fresh"] if fresh else places["run"]}')
  needs_data = args[0] == 'train.py' and case_id != 'env_data_dir_in_file'
  if needs_data and not any(a.startswith('--config.data_dir') for a in args):
    args.append(f'--config.data_dir={places["data"]}')
  return args


def run_cases(cases, places, tmp):
  """{case_id: (args, result)}: every case's command line run as `python
  <args>` would, in forked children of one process that imported the
  project once (tests/forkrun.py: most of a subprocess's cost is importing
  JAX), two at a time."""
  jobs, ids = [], []
  for case_id, command, _ in cases:
    env = dict(os.environ)
    if case_id == 'env_data_dir_in_file':
      env['LRA_DATA_DIR'] = os.path.join(places['file'], 'data')
    jobs.append(
      {'args': expand(command, places, case_id), 'env': env, 'cwd': ROOT}
    )
    ids.append(case_id)
  jobs_path, results_path = str(tmp / 'jobs.json'), str(tmp / 'results.json')
  with open(jobs_path, 'w') as f:
    json.dump(jobs, f)
  subprocess.run(
    [
      sys.executable,
      os.path.join(ROOT, 'tests', 'forkrun.py'),
      jobs_path,
      results_path,
    ],
    cwd=ROOT,
    check=True,
    timeout=600,
  )
  with open(results_path) as f:
    results = json.load(f)
  return {
    case_id: (job['args'], types.SimpleNamespace(**result))
    for case_id, job, result in zip(ids, jobs, results)
  }


@pytest.fixture(scope='module')
def table(tmp_path_factory, smoke_run, smoke_data_dir):
  tmp = tmp_path_factory.mktemp('errors')
  places = dict(
    run=smoke_run,
    data=smoke_data_dir,
    fresh=str(tmp / 'fresh'),
    file=str(tmp / 'a_file'),
    tmp=str(tmp),
    bad_cache=text_cache(str(tmp / 'bad_cache')),
    bad_ckpt=damaged_run(smoke_run, str(tmp / 'bad_ckpt')),
  )
  open(places['file'], 'w').close()
  places['empty_tsv'] = str(tmp / 'empty_tsv')
  write_tsvs(os.path.join(places['empty_tsv'], 'listops', 'release'), '', 0)
  places['bad_tsv'] = str(tmp / 'bad_tsv')
  write_tsvs(
    os.path.join(places['bad_tsv'], 'listops', 'release'),
    '( ( [MIN 2 ) ] )\tseven\n',
  )
  watched = {p: digest(places[p]) for p in ('run', 'data', 'bad_cache')}
  results = run_cases(CASES, places, tmp)
  after = {p: digest(places[p]) for p in watched}
  return places, results, watched, after


@pytest.mark.parametrize(
  'case_id, match', [(c[0], c[2]) for c in CASES], ids=[c[0] for c in CASES]
)
def test_error_case_is_one_sentence_and_exit_2(table, case_id, match):
  places, results, _, _ = table
  args, proc = results[case_id]
  shown = f'{args}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}'
  assert proc.returncode == 2, shown
  assert 'Traceback' not in proc.stderr, shown
  errors = [ln for ln in proc.stderr.splitlines() if 'error:' in ln]
  assert len(errors) == 1 and errors[0].startswith('error: '), shown
  assert proc.stderr.strip().splitlines()[-1] == errors[0], shown
  assert match in errors[0], shown
  assert errors[0].endswith(('.', '.`')), errors[0]
  assert not os.path.exists(places['fresh']), shown


def test_error_cases_leave_checkpoints_and_caches_alone(table):
  _, _, before, after = table
  for name in before:
    assert before[name] and after[name] == before[name], name


# --------------------------------------------------- in-process checks


def test_every_bound_of_the_validation_pass_names_its_flag():
  from configs import listops

  for key, (lowest, example) in validate._INT_AT_LEAST.items():
    config = listops.get_config('transformer,smoke')
    *parents, leaf = key.split('.')
    node = config
    for p in parents:
      node = node[p]
    node[leaf] = lowest - 1
    with pytest.raises(UserError, match=f'--config.{key}='):
      validate.check_config(config)
    node[leaf] = example
  for key, spec in validate._FLOAT_RANGE.items():
    config = listops.get_config('transformer,smoke')
    *parents, leaf = key.split('.')
    node = config
    for p in parents:
      node = node[p]
    node[leaf] = float('nan')
    with pytest.raises(UserError, match=f'--config.{key}=nan'):
      validate.check_config(config)
  validate.check_config(listops.get_config('transformer,smoke'))


def test_check_dir_creates_nothing(tmp_path):
  target = tmp_path / 'a' / 'b'
  validate.check_dir(str(target), '--workdir')
  assert not (tmp_path / 'a').exists()
  (tmp_path / 'f').write_text('')
  with pytest.raises(UserError, match='is a file, not a directory'):
    validate.check_dir(str(tmp_path / 'f'), '--workdir')


def test_cache_record_catches_changed_bytes(tmp_path):
  path = str(tmp_path / 'c')
  cache.save_split(path, 'train', np.ones((4, 8), np.uint8), np.arange(4))
  record = json.load(open(os.path.join(path, 'train_meta.json')))
  assert record['inputs']['shape'] == [4, 8]
  cache.verify_split(path, 'train')
  labels = os.path.join(path, 'train_labels.npy')
  with open(labels, 'r+b') as f:
    f.seek(-1, 2)
    f.write(b'\x7f')
  with pytest.raises(cache.CacheError, match='recorded checksum'):
    cache.load_split(path, 'train')
  with pytest.raises(UserError, match='has no examples'):
    cache.save_split(path, 'val', np.ones((0, 8), np.uint8), [])


def test_truncated_generated_cache_is_rebuilt_with_a_warning(
  tmp_path, smoke_data_dir, capsys
):
  from configs import listops
  from lra import data as tasks
  from lra.train import runtime

  data_dir = str(tmp_path / 'data')
  shutil.copytree(smoke_data_dir, data_dir)
  config = listops.get_config('transformer,smoke')
  config.data_dir = data_dir
  task = tasks.get_task('listops')
  path = task.cache_dir(data_dir, config.data.to_dict())
  target = os.path.join(path, 'train_inputs.npy')
  original = open(target, 'rb').read()
  truncate(target)
  data = runtime.load_data(config, task, progress=False)
  err = capsys.readouterr().err
  assert 'warning: ' in err and 'train_inputs.npy is truncated' in err
  assert 'regenerating' in err
  assert open(target, 'rb').read() == original
  assert len(data['train'][1]) == data['train'][0].shape[0]


@pytest.mark.filterwarnings('ignore::pytest.PytestUnraisableExceptionWarning')
@pytest.mark.parametrize(
  'damage',
  ['truncated_array', 'unrecorded', 'no_manifest', 'no_meta', 'no_state'],
)
def test_damaged_checkpoint_is_skipped_with_a_warning(
  damage, tmp_path, smoke_run, capfd
):
  from configs import listops
  from lra import data as tasks
  from lra.train import build, loop, runtime
  from lra.train.checkpoints import Checkpoints

  workdir = str(tmp_path / 'run')
  shutil.copytree(smoke_run, workdir)
  step_dir = os.path.join(workdir, 'checkpoints', 'latest', '6')
  if damage in ('truncated_array', 'unrecorded'):
    for path in array_files(step_dir):
      truncate(path, 0.3)
    if damage == 'unrecorded':  # a save without its size record: orbax's
      # own error is caught (its threads may still print to stderr)
      shutil.rmtree(os.path.join(workdir, 'checkpoints', 'records'))
  elif damage == 'no_manifest':
    os.remove(os.path.join(step_dir, 'state', 'manifest.ocdbt'))
  elif damage == 'no_meta':
    os.remove(os.path.join(step_dir, 'meta', 'metadata'))
  else:
    shutil.rmtree(os.path.join(step_dir, 'state'))
  config = listops.get_config('transformer,smoke')
  task = tasks.get_task('listops')
  replicated, _ = runtime.make_mesh()
  _, state = build.create_state(config, task, replicated)
  ckpt = Checkpoints(workdir)
  best_steps = ckpt.all_steps('best')
  step, _, best = loop.resume_state(ckpt, state)
  ckpt.close()
  err = capfd.readouterr().err
  assert damage == 'unrecorded' or 'Traceback' not in err, err
  assert 'warning: The latest checkpoint at step 6' in err, err
  reason = 'is unreadable' if damage == 'unrecorded' else 'is incomplete'
  assert reason in err, err
  assert step == (6 if best_steps == [6] else 3)
  assert best['step'] in best_steps
  unreadable = os.path.join(workdir, 'checkpoints', 'unreadable')
  assert 'latest_6' in os.listdir(unreadable)
  assert not os.path.exists(step_dir)


def test_prepare_docstring_examples_parse(tmp_path):
  """Every `python -m lra.data.prepare` line of lra/data/prepare.py's docstring is a
  valid command (parsed and its options checked, nothing generated)."""
  import shlex

  from lra import data as tasks
  from lra.data import prepare

  lines = [
    ln.strip()
    for ln in prepare.__doc__.splitlines()
    if ln.strip().startswith('python -m lra.data.prepare')
  ]
  assert len(lines) >= 3
  for line in lines:
    words = shlex.split(line.replace('[', '').replace(']', ''))[3:]
    words = [
      {'DIR': str(tmp_path), 'N': '1'}.get(w, w) for w in words
    ]  # placeholders
    args = prepare.build_parser().parse_args(words)
    options = prepare.parse_options(args)
    tasks.get_task(args.task).cache_dir(str(tmp_path), options)


def test_no_project_file_points_outside_the_project():
  names = ['README.md', 'train.py', 'eval.py', 'benchmark.py']
  for folder in ('configs', 'lra', 'models'):
    for sub, _, files in os.walk(os.path.join(ROOT, folder)):
      names += [
        os.path.relpath(os.path.join(sub, f), ROOT)
        for f in files
        if f.endswith(('.py', '.md'))
      ]
  for name in names:
    with open(os.path.join(ROOT, name)) as f:
      assert '../shared' not in f.read(), name
