"""The model zoo: attention cores (models/attention/, one module per method,
found by name through its registry), embeddings and positions, layers,
encoders (plain, reversible, recurrent), heads, and the builder
(models.classifier.build_model) that train.py, eval.py and benchmark.py call.

models/ never imports lra/ (the harness and task data): bad options raise the
top-level errors.UserError, which the entry points print as one sentence;
tests/test_layout.py checks this.
"""
