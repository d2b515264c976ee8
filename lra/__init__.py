"""The Long Range Arena harness, with the task data in its own subpackage.

  lra/tasks/     the tasks: generators, readers, caches and the task registry
                 (lra/tasks/__init__.py); see its docstring.
  lra/ (here)    the training harness around them: runtime (mesh, data
                 loading, exact evaluation), steps (loss, train/eval step),
                 batching, checkpoints, metrics (metrics.jsonl, TensorBoard;
                 wandb_log: Weights & Biases),
                 cli and validate (flags and configs), the tools
                 (prepare + download, sweep, report, bench_report, curves)
                 and errors (UserError, from the top-level errors.py).

The harness never imports models/: the top-level scripts (train.py, eval.py,
benchmark.py, scaling.py) build the model (models.classifier.build_model)
and hand it to the harness; models/ never imports lra/ (tests/test_layout.py
checks both).
"""
