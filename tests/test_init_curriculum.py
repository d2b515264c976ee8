"""Fine-tuning from a pretrained run (--config.init_from), Longformer's
position extension and Shortformer's length curriculum
(--config.length_schedule), on smoke ListOps."""

import json
import os
import subprocess
import sys

from flax import nnx
import jax
import numpy as np
import pytest
from test_models_tasks import task_config

from configs import base
from configs import listops as listops_config
from lra import data as tasks
from lra.errors import UserError
from lra.train import build, curriculum, rundir, runtime, steps
from lra.train.checkpoints import Checkpoints
from lra.train.metrics import read_rows
from models.embeddings import extend_positions_LxE
import train

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMOKE = 'configs/listops.py:transformer,smoke'
SCHEDULE = '2:16,2:32'  # steps 1-2 at 16 tokens, 3-4 at 32, 5-6 at 64


def smoke_config(data_dir, **changes):
  return task_config('listops', 'transformer', data_dir=data_dir, **changes)


def fresh_state(config):
  replicated, _ = runtime.make_mesh()
  return build.create_state(config, tasks.get_task('listops'), replicated)


def pure(state, part=0):
  return jax.device_get(nnx.to_pure_dict(state)[part])


# ------------------------------------------------------------ schedule
def test_length_schedule_stage_boundaries_and_bad_schedules():
  stages = curriculum.parse(SCHEDULE, 64)
  assert stages == [(2, 16), (4, 32)]
  lengths = [curriculum.length_at(stages, s, 64) for s in range(1, 8)]
  assert lengths == [16, 16, 32, 32, 64, 64, 64]
  assert curriculum.parse('', 64) == []
  assert curriculum.parse(' 1000:256 , 2000:1024', 2000) == [
    (1000, 256),
    (3000, 1024),
  ]
  for bad in ('100', '0:16', '10:0', 'a:16', '10:16,', '10:65'):
    with pytest.raises(UserError) as e:
      curriculum.parse(bad, 64)
    message = str(e.value)
    assert (
      message.replace('e.g. ', '').count('. ') == 0
      and 'length_schedule' in message
    )


def test_crops_are_prefixes_or_windows_of_the_same_rows():
  rng = np.random.default_rng(0)
  inputs = rng.integers(1, 9, (8, 2, 40))
  inputs[:, :, 30:] = 0  # padding at the end
  inputs[3, 1, 5:] = 0  # a document shorter than the window
  prefix = curriculum.crop(inputs, 16)
  np.testing.assert_array_equal(prefix, inputs[..., :16])
  kw = dict(windows=True, seed=1, step=7, pad_id=0)
  windows = curriculum.crop(inputs, 16, **kw)
  np.testing.assert_array_equal(windows, curriculum.crop(inputs, 16, **kw))
  starts = set()
  for b in range(8):
    for d in range(2):
      row = inputs[b, d]
      hits = [
        s
        for s in range(31 - 16 + 1)
        if (row[s : s + 16] == windows[b, d]).all()
      ]
      assert hits, (b, d)  # a contiguous window inside the real tokens
      starts.add(hits[0])
  assert len(starts) > 3  # the starts vary
  np.testing.assert_array_equal(windows[3, 1], inputs[3, 1, :16])
  other = curriculum.crop(inputs, 16, **{**kw, 'step': 8})
  assert not np.array_equal(windows, other)
  # Each process crops its rows as the whole global batch would.
  rows = slice(4, 8)
  part = curriculum.crop(inputs[rows], 16, rows=rows, global_rows=8, **kw)
  np.testing.assert_array_equal(part, windows[rows])


# ------------------------------------------------------------ init_from
def test_init_from_starts_from_exactly_the_pretrained_encoder(
  smoke_run, smoke_data_dir, monkeypatch
):
  # A path relative to the working directory, as users type it (orbax reads
  # no metadata through one unless made absolute).
  monkeypatch.chdir(os.path.dirname(smoke_run))
  relative = os.path.basename(smoke_run)
  config = smoke_config(smoke_data_dir, init_from=relative, seed=3)
  _, state = fresh_state(config)
  _, fresh = fresh_state(config)
  state, step = build.init_from(config, state)
  best = Checkpoints(smoke_run)
  assert step == best.latest_step('best')
  _, like = fresh_state(smoke_config(smoke_data_dir))
  saved, _ = best.restore('best', step, like)
  best.close()
  got, want = pure(state), pure(saved)
  jax.tree.map(np.testing.assert_array_equal, got['encoder'], want['encoder'])
  # The head is the fine-tune's own fresh one (seed 3), not the saved one.
  jax.tree.map(np.testing.assert_array_equal, got['head'], pure(fresh)['head'])
  # So is the optimizer: its step count and moments are at their start.
  jax.tree.map(np.testing.assert_array_equal, pure(state, 1), pure(fresh, 1))
  with pytest.raises(AssertionError):
    kernel = 'hidden', 'kernel'
    np.testing.assert_array_equal(
      got['head'][kernel[0]][kernel[1]], want['head'][kernel[0]][kernel[1]]
    )


def test_init_from_mismatch_is_one_sentence_naming_the_parameter(
  smoke_run, smoke_data_dir, tmp_path
):
  config = smoke_config(
    smoke_data_dir, init_from=smoke_run, **{'model.mlp_dim': 24}
  )
  with pytest.raises(UserError) as e:
    build.init_from(config, fresh_state(config)[1])
  message = str(e.value)
  assert 'encoder.blocks.0.mlp.fc1.bias has shape (32,) there but (24,)' in (
    message
  )
  assert message.replace('e.g. ', '').count('. ') == 0 and message.endswith('.')
  config = smoke_config(
    smoke_data_dir, init_from=smoke_run, **{'model.num_layers': 2}
  )
  with pytest.raises(UserError, match=r'has no parameter encoder\.blocks\.1'):
    build.init_from(config, fresh_state(config)[1])
  config = smoke_config(smoke_data_dir, init_from=str(tmp_path / 'none'))
  with pytest.raises(UserError, match='is not a directory'):
    build.init_from(config, fresh_state(config)[1])


# ------------------------------------------------------ position extension
def test_extended_position_table_repeats_the_trained_one():
  trained = np.arange(5 * 3).reshape(5, 3).astype(np.float32)
  out = extend_positions_LxE(trained, 13)
  np.testing.assert_array_equal(out[:5], trained)
  np.testing.assert_array_equal(out[5:10], trained)
  np.testing.assert_array_equal(out[10:], trained[:3])
  cls = extend_positions_LxE(trained, 13, keep=1)  # row 0: the CLS's
  np.testing.assert_array_equal(cls[:5], trained)
  np.testing.assert_array_equal(cls[5:9], trained[1:])
  np.testing.assert_array_equal(cls[9:13], trained[1:])
  np.testing.assert_array_equal(extend_positions_LxE(trained, 4), trained[:4])


def test_classifier_from_a_shorter_lm_extends_learned_positions(
  smoke_data_dir, tmp_path
):
  # Pretrained as a language model (one more token row: the mask id).
  short = smoke_config(
    smoke_data_dir,
    max_length=8,
    objective='masked_lm',
    **{'model.positions': 'learned'},
  )
  _, state = fresh_state(short)
  pretrained = str(tmp_path / 'pre')
  ckpt = Checkpoints(pretrained)
  ckpt.save('best', 3, state, {'step': 3, 'best': {}})
  ckpt.close()
  long = smoke_config(
    smoke_data_dir,
    max_length=20,
    init_from=pretrained,
    **{'model.positions': 'learned'},
  )
  state_long, _ = build.init_from(long, fresh_state(long)[1])
  trained = pure(state)['encoder']['embed']['pos_LxE']  # 9 rows: CLS + 8
  table = pure(state_long)['encoder']['embed']['pos_LxE']
  assert trained.shape[0] == 9 and table.shape[0] == 21
  np.testing.assert_array_equal(table[:9], trained)
  np.testing.assert_array_equal(table[9:17], trained[1:])
  np.testing.assert_array_equal(table[17:], trained[1:5])
  tokens = pure(state_long)['encoder']['embed']['tokens']
  lm_tokens = pure(state)['encoder']['embed']['tokens']['embedding']
  assert lm_tokens.shape[0] == tokens['embedding'].shape[0] + 1 == 17
  np.testing.assert_array_equal(tokens['embedding'], lm_tokens[:16])
  assert 'lm_head' in pure(state) or 'bias_V' in pure(state)
  assert 'head' in pure(state_long) and 'bias_V' not in pure(state_long)


def test_evaluating_at_a_longer_length_extends_learned_positions(
  smoke_data_dir,
):
  config = smoke_config(
    smoke_data_dir, max_length=8, **{'model.positions': 'learned'}
  )
  replicated, _ = runtime.make_mesh()
  task = tasks.get_task('listops')
  _, state = build.create_state(config, task, replicated)
  _, longer = build.at_length(config, task, replicated, state, 20)
  trained, got = pure(state), pure(longer)
  table = got['encoder']['embed']['pos_LxE']
  np.testing.assert_array_equal(
    table, extend_positions_LxE(trained['encoder']['embed']['pos_LxE'], 21, 1)
  )
  jax.tree.map(np.testing.assert_array_equal, got['head'], trained['head'])


@pytest.mark.slow
def test_eval_py_max_length_evaluates_a_saved_run_longer(
  smoke_data_dir, tmp_path
):
  config = smoke_config(
    smoke_data_dir, max_length=8, **{'model.positions': 'learned'}
  )
  _, state = fresh_state(config)
  workdir = str(tmp_path / 'run')
  ckpt = Checkpoints(workdir)
  ckpt.save('best', 3, state, {'step': 3, 'best': {}})
  ckpt.close()
  rundir.write_config(config, workdir)
  proc = subprocess.run(
    [sys.executable, 'eval.py', f'--workdir={workdir}', '--max_length=20'],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert proc.returncode == 0, proc.stderr
  result = json.load(open(os.path.join(workdir, 'eval_test_best_len20.json')))
  assert result['max_length'] == 20 and result['count'] == 64


@pytest.mark.slow
def test_staged_fine_tune_compiles_once_per_stage_and_records_init_from(
  smoke_run, smoke_data_dir, tmp_path, monkeypatch, capsys
):
  """One in-process run with both: a curriculum and a pretrained encoder."""
  made = []

  def recording(graphdef, prepare=None, *args, **kwargs):
    made.append(
      steps.make_train_step.__wrapped__(graphdef, prepare, *args, **kwargs)
    )
    return made[-1]

  recording.__wrapped__ = steps.make_train_step
  monkeypatch.setattr(steps, 'make_train_step', recording)
  config = smoke_config(
    smoke_data_dir, length_schedule=SCHEDULE, init_from=smoke_run
  )
  workdir = str(tmp_path / 'staged')
  train.train_and_evaluate(config, workdir)
  rows = read_rows(os.path.join(workdir, 'metrics.jsonl'))
  lengths = {r['step']: r['length'] for r in rows if r['split'] == 'train'}
  assert lengths == {2: 16, 3: 32, 4: 32, 6: 64}
  assert made[0]._cache_size() == 3  # pylint: disable=protected-access
  assert f'Encoder from {smoke_run} (best checkpoint' in capsys.readouterr().out
  first = rows[0]
  assert first['split'] == 'config' and first['step'] == 0
  assert first['init_from'] == os.path.abspath(smoke_run)


# ------------------------------------------------ resume inside a stage
@pytest.mark.slow
def test_resume_inside_a_stage_ends_like_an_uninterrupted_run(
  tmp_path, smoke_data_dir
):
  def run(workdir, *extra):
    return subprocess.run(
      [
        sys.executable,
        'train.py',
        f'--config={SMOKE}',
        f'--workdir={workdir}',
        f'--config.data_dir={smoke_data_dir}',
        f'--config.length_schedule={SCHEDULE}',
        *extra,
      ],
      cwd=ROOT,
      capture_output=True,
      text=True,
      timeout=300,
    )

  whole, killed = str(tmp_path / 'whole'), str(tmp_path / 'killed')
  assert run(whole).returncode == 0
  # Killed after step 4 (stage 2; last checkpoint: step 3, in stage 2).
  assert run(killed, '--stop_after_steps=4').returncode == 3
  proc = run(killed)
  assert proc.returncode == 0, proc.stderr
  assert f'Resuming {killed} from step 3.' in proc.stdout
  results = [
    json.load(open(os.path.join(w, 'results.json'))) for w in (whole, killed)
  ]
  assert results[0] == results[1]
  strip = lambda rows: [  # noqa: E731
    {k: v for k, v in r.items() if k != 'steps_per_sec'} for r in rows
  ]
  rows = [read_rows(os.path.join(w, 'metrics.jsonl')) for w in (whole, killed)]
  assert strip(rows[0]) == strip(rows[1])


def test_runs_saved_before_these_keys_resume(smoke_run, tmp_path):
  """A config.json without init_from, init_from_checkpoint and
  length_schedule (older runs) resumes when they have their defaults."""
  config = json.load(open(os.path.join(smoke_run, 'config.json')))
  for key in ('init_from', 'init_from_checkpoint', 'length_schedule'):
    del config[key]
  workdir = tmp_path / 'old'
  (workdir / 'checkpoints' / 'latest' / '3').mkdir(parents=True)
  (workdir / 'config.json').write_text(json.dumps(config))
  new = listops_config.get_config('transformer,smoke')
  new.data_dir = config['data_dir']
  assert rundir.check_resume(new, str(workdir), base.get_base_config()) == {}
  new.length_schedule = '2:16'
  with pytest.raises(UserError, match=r'\(length_schedule differ'):
    rundir.check_resume(new, str(workdir), base.get_base_config())
