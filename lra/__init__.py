"""The Long Range Arena harness, in floors; imports run only downward.

  lra/sweep/   the engine that runs many trainings: plan, grid, run,
               estimate, probe, archive.
  lra/bench/   the step and layer benchmarks, their subprocess isolation
               and report. lra/sweep and lra/bench import lra/report and
               below, never each other.
  lra/report/  reads finished runs: accuracy tables beside the paper,
               curves, the bubble chart, eval.py's body (eval_main).
  lra/train/   what one training run is made of: train.py's body (main),
               the loop, steps, objectives, batching, prefetch,
               curriculum, checkpoints, metrics and progress, processes,
               runtime, the run directory, the results, load_run, the
               model names and options, and the config loader (config.py:
               the one module that imports configs/).
  lra/data/    every task behind one data contract (lra/data/__init__.py):
               generators, release readers, caches, prepare, download.

models/ (the model zoo) never imports lra/; tests/test_layout.py checks the
directions and that there is no import cycle.

  from lra import load_run
  run = load_run('runs/listops')   # .config, .model, .predict, .evaluate

Importing lra first tells glibc's malloc to keep freed memory
(lra/allocator.py; LRA_MALLOC=system keeps glibc's defaults), before JAX
allocates: every entry point and child process imports lra.
"""

from lra import allocator as _allocator

_allocator.configure()


def load_run(workdir, which='best', step=None):
  """A trained run (lra/train/load.py): its locked config, its NNX model
  with the `which` checkpoint's weights ('best' or 'latest'), predict and
  evaluate."""
  from lra.train.load import load_run as load  # pylint: disable=g-import-not-at-top

  return load(workdir, which, step)
