"""The engine that runs many trainings: a sweep of tasks x models x presets
x grid axes, one workdir a run, resumable, each run its own process.

  main.py      the command line (`lra-sweep`, `python -m lra.sweep`)
  plan.py      which runs a command names (tasks, models, presets, grid)
  spec.py      a sweep written as a Python file (--sweep FILE.py:FN)
  grid.py      grid axes: the cross product, tuned rows, diverged runs
  runner.py    runs them one after another (a child process each), skips
               the finished, records failures; `Sweep`
  estimate.py  --dry_run: the time each run will take
  probe.py     measures a run's step on this machine for the estimate
  archive.py   a sweep's results without checkpoints, small enough to commit
"""
