"""Studies: each folder asks one question with many trainings (README.md,
its sweeps as Python files, its report and its archived runs). Not part of
the installed package; run from the repository root, e.g.
`python -m experiments.mqar.report`."""
