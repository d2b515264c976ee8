"""Test setup: CPU only, 4 fake devices so sharding is exercised everywhere."""

import os
import shutil
import sys
import tempfile

import pytest

os.environ['JAX_PLATFORMS'] = 'cpu'
# The suite's programs are tiny and compiled once each, so compiling is most
# of its time: LLVM's optimisation level 0 and no expensive passes compile
# them about 1.7x faster (measured on test_attention_suite + test_mixer_s5:
# 99 s -> 59 s, issue 51). Results are the same programs' results (no
# fast-math either way); LRA_TEST_XLA_OPT=1 compiles as the programs do.
_FAST_COMPILE = (
  ''
  if os.environ.get('LRA_TEST_XLA_OPT') == '1'
  else ' --xla_backend_optimization_level=0'
  ' --xla_llvm_disable_expensive_passes=true'
)
os.environ['XLA_FLAGS'] = (
  os.environ.get('XLA_FLAGS', '')
  + ' --xla_force_host_platform_device_count=4'
  + _FAST_COMPILE
)
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Tests never read or write the user's data directory: each pytest
# process (the main one and each xdist worker) gets its own, removed when
# its session ends (pytest_sessionfinish).
_DATA_DIR = os.environ['LRA_DATA_DIR'] = tempfile.mkdtemp(
  prefix='lra_test_data_'
)
# One persistent XLA compilation cache for the session's processes (both
# pytest workers and every train.py / benchmark.py subprocess they start):
# the smoke configs' steps compile once, not once per process. Executables
# are keyed by their program and options, so no number changes.
# The process that loads this first (pytest itself, before it starts the
# xdist workers, which inherit its environment) makes the folder and
# removes it at the end (pytest_sessionfinish).
_OWN_CACHE = 'JAX_COMPILATION_CACHE_DIR' not in os.environ
if _OWN_CACHE:
  os.environ['JAX_COMPILATION_CACHE_DIR'] = tempfile.mkdtemp(
    prefix='lra_test_xla_cache_'
  )
  os.environ['JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS'] = '0'
  os.environ['JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES'] = '0'


def pytest_sessionfinish(session, exitstatus):
  del session, exitstatus
  shutil.rmtree(_DATA_DIR, ignore_errors=True)
  if _OWN_CACHE:
    shutil.rmtree(os.environ['JAX_COMPILATION_CACHE_DIR'], ignore_errors=True)


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMOKE = 'configs/listops.py:transformer,smoke'


def _once_per_session(tmp_path_factory, name, build):
  """A folder built once for the whole test session, shared by both
  pytest-xdist workers (a file lock; the first worker builds, the other
  waits and reuses it): the smoke data and the smoke run were built once
  per worker before (about 30 s of CPU each time). `build(path)` fills
  the folder; a build that fails leaves no marker, so the next one
  retries."""
  from filelock import FileLock  # pylint: disable=g-import-not-at-top

  root = tmp_path_factory.getbasetemp()
  if os.environ.get('PYTEST_XDIST_WORKER'):
    root = root.parent  # the session's folder, above each worker's own
  path = root / name
  with FileLock(str(path) + '.lock'):
    if not (root / f'{name}.done').exists():
      shutil.rmtree(path, ignore_errors=True)
      path.mkdir()
      build(str(path))
      (root / f'{name}.done').touch()
  return str(path)


@pytest.fixture(scope='session')
def smoke_data_dir(tmp_path_factory):
  """A data root with the ListOps smoke cache (shared; never modify it)."""
  from lra import data as tasks  # pylint: disable=g-import-not-at-top

  def build(path):
    tasks.get_task('listops').ensure_prepared(path, {'variant': 'smoke'}, False)

  return _once_per_session(tmp_path_factory, 'shared_data', build)


@pytest.fixture(scope='session')
def smoke_run(tmp_path_factory, smoke_data_dir):
  """A finished smoke ListOps run (shared; copy it before damaging it)."""
  import subprocess  # pylint: disable=g-import-not-at-top

  def build(workdir):
    proc = subprocess.run(
      [
        sys.executable,
        'train.py',
        f'--config={SMOKE}',
        f'--workdir={workdir}',
        f'--config.data_dir={smoke_data_dir}',
      ],
      cwd=ROOT,
      capture_output=True,
      text=True,
      timeout=300,
    )
    assert proc.returncode == 0, proc.stderr

  return _once_per_session(tmp_path_factory, 'shared_full', build)


def tree(folder):
  """{relative path: bytes} of every file below `folder` (tests that check
  a refusal touched nothing)."""
  out = {}
  for d, _, files in os.walk(folder):
    for f in files:
      path = os.path.join(d, f)
      with open(path, 'rb') as fh:
        out[os.path.relpath(path, folder)] = fh.read()
  return out


# Checks kept out of the README's test line for time (run them with
# `python -m pytest -q -m slow`), chosen from `--durations=0` of an idle
# run (2026-12-07, issue 51): whole training runs in subprocesses whose
# behaviour another test in the line also covers, and the repeats of a
# parametrized check beyond the cases that keep each code path in the
# line. Each entry is a test function (every case) or one case by id;
# tests/test_figures.py checks each still names a test. The backbone
# (exact limits, recurrences, padding and causality of every core and
# mixer) stays in the line.
SLOW = (
  # Whole runs in subprocesses (seconds in that idle run).
  'test_race.py::test_gemm_rows_have_both_sides',  # 3 (with torch; 0.5 GB products)
  'test_devicecheck.py::test_tiny_run_completes_within_its_budget',  # 77
  'test_multiprocess.py::test_eval_with_two_processes_counts_each_example_once',  # 77
  'test_sweep.py::test_interrupt_then_rerun_equals_an_uninterrupted_run',  # 56
  'test_sweep.py::test_jobs_run_side_by_side_and_prepare_the_data_once',  # 19
  'test_locality.py::test_the_same_command_skips_every_run_and_plot_only_remakes',  # 45
  'test_reference_queue.py::test_queue_stops_resumes_and_reports',  # 41
  'test_new_core.py::test_a_new_core_is_one_file',  # 31
  'test_train.py::test_sigterm_saves_and_the_run_resumes_exactly',  # 30
  'test_train.py::test_killed_while_a_save_is_written_resumes_exactly',  # 19
  'test_hostile.py::test_diverged_steps_are_never_kept_and_a_lower_rate_recovers',  # 25
  'test_hostile.py::test_a_held_workdir_refuses_a_second_training',  # 17
  'test_hostile_run.py::test_a_folder_of_someone_elses_files_is_refused_then_allowed',  # 25
  'test_hostile_files.py::test_a_truncated_kernel_in_the_build_cache_is_rebuilt',  # 16
  'test_benchmark.py::test_table_says_when_there_is_no_exact_baseline',  # 20
  'test_benchmark.py::test_models_transformer_runs_one_model_only',  # 14
  'test_benchmark.py::test_config_flag_runs_a_cell_in_its_own_process',  # 14
  'test_objectives.py::test_masked_lm_steps_are_the_same_on_one_and_four_devices',  # 14
  # Repeats: one or more cases of each stay in the line.
  'test_hostile_run.py::test_a_signal_at_any_stage_is_one_line_and_the_resume_ends_the_same[training-SIGINT]',
  'test_hostile_run.py::test_a_signal_at_any_stage_is_one_line_and_the_resume_ends_the_same[save-SIGHUP]',
  'test_tasks_train.py::test_train_smoke_on_task[image]',
  'test_tasks_train.py::test_train_smoke_on_task[pathfinder]',
  'test_tasks_train.py::test_train_smoke_on_task[text]',
  'test_models_tasks.py::test_model_trains_on_listops[reformer-True]',
  'test_models_tasks.py::test_model_trains_on_listops[transformer_xl-False]',
  *(
    f'test_models_tasks.py::test_model_traces_on_every_task[{case}]'
    for case in (
      'compressive_transformer-False',
      'deltanet-False',
      'gla-False',
      'h3-False',
      'hyena-False',
      'linear_transformer-True',
      'linformer-False',
      'longformer-False',
      'mamba-False',
      'mamba2-False',
      'reformer-True',
      'retnet-False',
      's5-False',
      'sinkhorn-False',
      'synthesizer-False',
      'transformer_xl-False',
    )
  ),
  *(
    f'test_options.py::test_every_option_from_the_command_line_then_one_step[{m}]'
    for m in (
      'compressive_transformer',
      'deltanet',
      'gla',
      'h3',
      'hyena',
      'linformer',
      'longformer',
      'mamba',
      'mamba2',
      'retnet',
      'sparse_transformer',
      'transformer_xl',
    )
  ),
  *(
    f'test_mixer_mamba.py::test_scan_gradients_equal_autodiff[{b}-{s}-xla]'
    for b in ('batch1', 'batch2')
    for s in ('100-100', '100-64', '37-20', '37-8')
  ),
  'test_hostile_files.py::test_a_resume_over_a_damaged_file_is_one_sentence_and_keeps_it[metrics.jsonl-binary]',
  'test_hostile_files.py::test_a_resume_over_a_damaged_file_is_one_sentence_and_keeps_it[metrics.jsonl-directory]',
  'test_hostile_files.py::test_a_resume_over_a_damaged_file_is_one_sentence_and_keeps_it[config.json-directory]',
  *(
    f'test_hostile_cli.py::test_help_prints_the_usage_and_the_flags_and_exits_0[command{i}-names{i}]'
    for i in (1, 2, 3, 4, 6)
  ),
  'test_remat_scan.py::test_same_loss_and_gradients_as_the_plain_model[options1]',
  'test_remat_scan.py::test_same_loss_and_gradients_as_the_plain_model[options2]',
  'test_mixer_suite.py::test_memory_grows_about_linearly[s5]',
  'test_mixer_suite.py::test_memory_grows_about_linearly[mamba2]',
  'test_mixer_suite.py::test_memory_grows_about_linearly[deltanet]',
  'test_experiments.py::test_a_study_sweep_through_the_command_line_dry_run[experiments/mqar/sweeps.py:width_grid-counts0]',
  # A second round from the same idle run (the line was still 14 min):
  # training steps whose path a kept test also compiles.
  'test_attn_bigbird.py::test_etc_encoder_prepends_and_removes_global_tokens',  # 13
  'test_train.py::test_damaged_checkpoints_are_skipped_and_the_run_finishes_the_same',  # 12
  'test_train.py::test_the_step_draws_the_key_the_loop_used_to_pass',  # 7
  'test_recurrent.py::test_aux_loss_reaches_the_training_loss_with_its_weight',  # 11
  'test_hostile_cli.py::test_train_with_a_broken_config_file_is_one_line_and_creates_nothing',  # 9
  'test_configs_cli.py::test_per_layer_windows_train_a_smoke_step',  # 9
  'test_reversible.py::test_ffn_chunks_equal_one_chunk_on_a_whole_model',  # 9
  'test_hostile_files.py::test_a_resume_over_a_damaged_file_is_one_sentence_and_keeps_it[results.json-truncated]',
  'test_scan_share.py::test_with_and_without_the_scan_and_the_scan_restored',  # 8
  'test_wandb.py::test_offline_run_logs_the_scalars_once_and_resumes_the_same_id',  # 8
  'test_estimate_probe.py::test_dry_run_without_earlier_runs_is_probed',  # 6
  'test_multiprocess.py::test_a_process_without_its_peers_stops_after_the_timeout',  # 5
  'test_hostile.py::test_checkpoints_of_another_model_are_refused_and_kept',  # 5
  *(
    f'test_options.py::test_every_option_from_the_command_line_then_one_step[{m}]'
    for m in ('bigbird', 'linear_transformer', 'local', 'reformer', 's4d', 'sinkhorn', 'synthesizer')
  ),
  *(
    f'test_models_tasks.py::test_model_traces_on_every_task[{case}]'
    for case in ('based-False', 'linformer-True', 'performer-True', 's4d-False', 'sparse_transformer-False')
  ),
  'test_models_tasks.py::test_positions_trace_on_every_task[pia]',
  'test_models_tasks.py::test_positions_trace_on_every_task[relative]',
  *(
    f'test_s5_reference.py::test_model_builds_and_train_step_traces[{t}]'
    for t in ('text', 'retrieval', 'image', 'pathx')
  ),
  *(
    f'test_mixer_suite.py::test_memory_grows_about_linearly[{m}]'
    for m in ('based', 'gla', 'h3', 'hyena')
  ),
  *(
    f'test_hostile_cli.py::test_console_scripts_help_names_their_flags[{s}]'
    for s in ('lra-eval', 'lra-prepare', 'lra-sweep')
  ),
  'test_positions_length.py::test_classifier_at_2l_is_finite_and_shift_invariant[transformer_xl-relative]',
  'test_positions_length.py::test_classifier_at_2l_is_finite_and_shift_invariant[transformer-sinusoidal]',
  'test_positions_length.py::test_causal_lm_at_2l_first_outputs_equal_those_at_l[transformer_xl-relative]',
  'test_positions_length.py::test_causal_lm_at_2l_first_outputs_equal_those_at_l[transformer-rotary]',
  'test_tasks_train.py::test_train_smoke_on_task[retrieval]',  # 15
  'test_models_tasks.py::test_model_trains_on_listops[reformer-False]',  # 10
  'test_ssm_groups.py::test_groups_at_the_same_rate_and_decay_equal_plain_adamw',  # 8
  'test_benchmark.py::test_ceiling_row_is_measured_beside_the_models',  # 5
  'test_hostile_run.py::test_the_flag_is_in_the_usage',  # 5
  # A third round (the line still took 12.5 min idle).
  'test_sweep.py::test_failure_is_recorded_and_the_sweep_goes_on',  # with the
  'test_sweep.py::test_second_invocation_skips_finished_runs',  # 55 s fixture
  'test_recurrent.py::test_training_step_memory_grows_linearly_in_segments',  # 15
  # A fourth (12:04 idle): two subprocess runs each; test_hostile_run's
  # SIGTERM case and test_train's resume keep a signal and a stop in the line.
  'test_train.py::test_non_finite_loss_stops_and_keeps_last_good_checkpoint',  # 28
  'test_hostile.py::test_ctrl_c_twice_in_training_and_once_in_eval_are_clean',  # 26
  'test_ssm_groups.py::test_the_group_takes_its_own_rate_and_no_decay',  # 9
)


def is_slow(nodeid):
  """Whether a test's node id ('tests/file.py::name[case]') is in SLOW."""
  rel = nodeid.split('tests/', 1)[-1]
  return any(rel == s or ('[' not in s and rel.startswith(s + '[')) for s in SLOW)


def pytest_collection_modifyitems(config, items):
  del config
  for item in items:
    if is_slow(item.nodeid):
      item.add_marker(pytest.mark.slow)
