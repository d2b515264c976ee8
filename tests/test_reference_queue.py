"""The reference queue (experiments/reference) on a CPU at smoke scale.

Two calls of the queue, as two leases would make them: the first runs a
speed job alone, then a failing job and a training side by side, and is
stopped at its deadline once the training has saved (the `should_stop`
hook stands in for the clock, which a loaded CPU makes unpredictable; the
stop itself is the deadline's: SIGTERM, save, archive). The work folder is
then deleted, as a fresh machine has none, and the second call resumes the
training from the checkpoint carried in the archive, skipping the done and
the failed jobs. The report then regenerates both tables from the archive.
"""

import dataclasses
import json
import os
import shutil
import tarfile

import pytest

from experiments.reference import archive as queue_archive
from experiments.reference import jobs as queue_jobs
from experiments.reference import queue, report
from experiments.reference.jobs import CARRY, MACHINE, Job

SMOKE = 'configs/listops.py:transformer,smoke'


def _jobs(data_dir):
  speed = queue_jobs.speed_jobs(tiny=True)[0]
  broken = Job(
    name='listops/broken',
    kind='train',
    args=('train.py', f'--config={SMOKE}', '--config.no_such_key=1'),
    seconds=20,
    shares=True,
    resume=CARRY,
    task='listops',
    row='broken',
    model='transformer',
  )
  long = Job(
    name='listops/transformer',
    kind='train',
    args=(
      'train.py',
      f'--config={SMOKE}',
      f'--config.data_dir={data_dir}',
      '--config.num_train_steps=200',
      '--config.checkpoint_every_steps=20',
      '--config.eval_every_steps=100',
    ),
    seconds=20,
    shares=True,
    resume=CARRY,
    task='listops',
    row='transformer',
    model='transformer',
  )
  return [speed, broken, long]


def _train_steps(path):
  with open(path) as f:
    rows = [json.loads(line) for line in f if line.strip()]
  return [r['step'] for r in rows if r.get('split') == 'train']


def test_queue_stops_resumes_and_reports(tmp_path, smoke_data_dir):
  jobs = _jobs(smoke_data_dir)
  archive, work = str(tmp_path / 'archive'), str(tmp_path / 'work')
  said = []
  long_work = os.path.join(work, 'listops', 'transformer')

  def deadline(running):
    failed = any(m.startswith('listops/broken: failed') for m in said)
    return failed and queue_archive.latest_step(long_work) >= 20

  call = queue.run_queue(
    jobs,
    archive,
    900,
    work=work,
    tail=60,
    slots=2,
    poll=0.2,
    say=said.append,
    should_stop=deadline,
  )
  # In order: the speed job alone, then the two sharing jobs side by side.
  assert call['started'] == [j.name for j in jobs]
  first = {}
  for i, m in enumerate(said):
    first.setdefault(m.split(' after ')[0].split(' (')[0], i)
  assert first['speed/64: done'] < first['listops/broken: started']
  state = json.load(open(os.path.join(archive, 'queue.json')))
  records = state['jobs']
  assert records['speed/64']['status'] == 'done'
  rows = json.load(open(os.path.join(archive, 'speed/64/benchmark.json')))
  assert [r['model'] for r in rows] == ['transformer', 'local']
  broken = records['listops/broken']
  assert broken['status'] == 'failed'
  assert 'no_such_key' in broken['error'] and broken['error'].startswith(
    'exit 2'
  )
  # The deadline stopped the training after a save; its checkpoint travels.
  long = records['listops/transformer']
  assert long['status'] == 'stopped' and long['checkpoint'] == 'carried'
  stopped_at = long['step']
  assert 20 <= stopped_at < 200
  carried = os.path.join(archive, 'listops/transformer/checkpoints/latest')
  assert os.listdir(carried) == [str(stopped_at)]
  assert os.path.exists(
    os.path.join(archive, 'listops/transformer/config.json')
  )

  # A fresh machine: nothing but the archive. The next call resumes.
  shutil.rmtree(work)
  said.clear()
  tarball = str(tmp_path / 'out' / 'archive.tgz')
  call = queue.run_queue(
    jobs,
    archive,
    900,
    work=work,
    tail=60,
    slots=2,
    poll=0.2,
    say=said.append,
    tarball=tarball,
  )
  assert call['started'] == ['listops/transformer']  # done, failed: skipped
  records = json.load(open(os.path.join(archive, 'queue.json')))['jobs']
  assert len(records['speed/64']['attempts']) == 1
  assert len(records['listops/broken']['attempts']) == 1
  long = records['listops/transformer']
  assert long['status'] == 'done' and long['step'] == 200
  assert [a['from_step'] for a in long['attempts']] == [0, stopped_at]
  run = os.path.join(archive, 'listops/transformer')
  assert not os.path.exists(os.path.join(run, 'checkpoints'))  # done: dropped
  results = json.load(open(os.path.join(run, 'results.json')))
  steps = _train_steps(os.path.join(run, 'metrics.jsonl'))
  assert min(steps) <= stopped_at < max(steps) == 200
  with tarfile.open(tarball) as tar:
    names = tar.getnames()
  assert 'archive/queue.json' in names
  assert 'archive/listops/transformer/results.json' in names
  assert os.path.getsize(tarball) < queue_archive.TARBALL_LIMIT_BYTES

  # The tables, regenerated from the archive between their markers.
  page = tmp_path / 'results.md'
  before, middle, after = '# Results\n\nkept\n', '\nalso kept\n', '\nend\n'
  page.write_text(
    before
    + '<!-- reference:begin -->\nold\n<!-- reference:end -->'
    + middle
    + '<!-- device-speed:begin -->\nold\n<!-- device-speed:end -->'
    + after
  )
  report.main(['--archive', archive, '--results', str(page)])
  text = page.read_text()
  assert text.startswith(before) and text.endswith(after) and middle in text
  assert 'old' not in text
  accuracy = 100 * results['test']['accuracy']
  assert (
    f'| ListOps | transformer | 36.37 | **{accuracy:.2f}** | 200 of 200 | '
    in text
  )
  assert '| ListOps | broken (`transformer`) | - | failed: exit 2' in text
  by_model = {r['model']: r for r in rows}
  ratio = (
    by_model['local']['steps_per_sec']
    / by_model['transformer']['steps_per_sec']
  )
  assert f'| `local` | {ratio:.2f}x / - |' in text


def test_restore_machine_and_carried(tmp_path):
  """A MACHINE job resumes from this machine's checkpoint and starts
  afresh without it; a CARRY job gets the archive's checkpoint back."""
  machine = Job(
    'listops/m', 'train', ('train.py',), 60, False, MACHINE, 'listops', 'm', 'm'
  )
  carry = dataclasses.replace(machine, name='pathfinder/c', resume=CARRY)
  archive, work = str(tmp_path / 'a'), str(tmp_path / 'w')
  q = queue.Queue([machine, carry], archive, work, 'reference', say=print)
  own = os.path.join(work, 'listops/m/checkpoints/latest/40')
  os.makedirs(own)
  q.restore(machine)
  assert os.path.isdir(own)  # kept: the run resumes from step 40
  shutil.rmtree(os.path.join(work, 'listops/m/checkpoints'))
  with open(os.path.join(work, 'listops/m/metrics.jsonl'), 'w') as f:
    f.write('{}\n')
  q.restore(machine)
  assert not os.path.exists(os.path.join(work, 'listops/m'))  # fresh start
  os.makedirs(os.path.join(archive, 'pathfinder/c/checkpoints/latest/30'))
  with open(os.path.join(archive, 'pathfinder/c/config.json'), 'w') as f:
    json.dump({'num_train_steps': 90}, f)
  q.state.jobs['pathfinder/c'].update(checkpoint='carried', step=30)
  q.state.jobs['pathfinder/c']['attempts'] = [
    {'from_step': 0, 'to_step': 30, 'seconds': 10.0}
  ]
  q.restore(carry)
  assert queue_archive.latest_step(os.path.join(work, 'pathfinder/c')) == 30
  # 60 steps left at the 3 steps/s its first attempt measured.
  record = q.state.jobs['pathfinder/c']
  assert queue_archive.remaining_seconds(carry, record, q.workdir(carry)) == 20


def test_second_call_adopts_the_machines_copy(tmp_path):
  """A tree sent with the archive from before this machine's first call
  gets the copy the machine kept (more calls); an older copy is ignored."""
  archive, work = str(tmp_path / 'a'), str(tmp_path / 'w')
  os.makedirs(archive)
  with open(os.path.join(archive, 'queue.json'), 'w') as f:
    json.dump({'queue': 'reference', 'calls': [{}]}, f)
  queue_archive.keep_mirror(archive, work)
  assert not queue_archive.adopt_newer(archive, work, 'reference')  # same
  with open(os.path.join(work, '_archive', 'queue.json'), 'w') as f:
    json.dump({'queue': 'reference', 'calls': [{}, {}]}, f)
  assert not queue_archive.adopt_newer(archive, work, 'tiny')  # another
  assert queue_archive.adopt_newer(archive, work, 'reference')
  assert json.load(open(os.path.join(archive, 'queue.json')))['calls'] == [
    {},
    {},
  ]


def test_cli_list_and_budget(tmp_path, capsys):
  archive = str(tmp_path / 'a')
  queue.main(['--tiny', '--list', '--archive', archive])
  out = capsys.readouterr().out
  names = [j.name for j in queue_jobs.queue_jobs(tiny=True)]
  assert all(f'`{n}`' in out for n in names)
  with pytest.raises(SystemExit) as e:
    queue.main(['--tiny', '--budget', '15', '--archive', archive])
  assert e.value.code == 2
  assert 'leaves nothing' in capsys.readouterr().err


def test_queue_names_known_models():
  """Every model the queue runs is a model name of the harness."""
  try:
    from lra.train.options import known_models
  except ImportError:
    from configs.models import known_models
  known = set(known_models())
  for job in queue_jobs.queue_jobs():
    assert job.model in known or job.kind == 'speed', job.name
  assert set(queue_jobs.SPEED_MODELS) == known
