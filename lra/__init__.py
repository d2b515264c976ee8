"""The Long Range Arena harness, in three floors; imports run only downward.

  lra/lab/     what runs or reads many trainings: sweeps, reports and
               tables, curves and plots, the paper's numbers, the locality
               probe, the device check, the benchmark's measurement code.
               The only floor that imports configs/.
  lra/train/   what one training run is made of: the loop, steps,
               objectives, batching, prefetch, curriculum, checkpoints,
               metrics and progress, logging, processes, runtime, the run
               directory, config validation, the CLI glue, load_run.
  lra/data/    every task behind one data contract (lra/data/__init__.py):
               generators, release readers, caches, prepare, download.

models/ (the model zoo) never imports lra/; tests/test_layout.py checks the
directions and that there is no import cycle.

  from lra import load_run
  run = load_run('runs/listops')   # .config, .model, .predict, .evaluate
"""


def load_run(workdir, which='best', step=None):
  """A trained run (lra/train/load.py): its locked config, its NNX model
  with the `which` checkpoint's weights ('best' or 'latest'), predict and
  evaluate."""
  from lra.train.load import load_run as load  # pylint: disable=g-import-not-at-top

  return load(workdir, which, step)
