"""The LRA paper's numbers: Table 1 (test accuracy) and Table 2 (speed and
memory) of Tay et al., "Long Range Arena: A Benchmark for Efficient
Transformers" (arXiv 2011.04006), as lra/reference/lra_paper.json holds them.

  table1_accuracy    {'columns': [listops, text, retrieval, image,
                     pathfinder, pathx, avg], <model>: [accuracy % per
                     column; null where the paper has none]}
  table2_efficiency  {'lengths': [1024, 2048, 3072, 4096], 'steps_per_sec'
                     and 'peak_memory_gb': {<model>: [one per length]}}

The LRA average (lra_average) is the paper's: the mean over the five tasks
without Path-X (every model failed Path-X there).
"""

from __future__ import annotations

import json
import os

import numpy as np

# The table's task columns, in the paper's order.
TASK_COLUMNS = ('listops', 'text', 'retrieval', 'image', 'pathfinder', 'pathx')
PAPER_JSON = os.path.join(
  os.path.dirname(os.path.dirname(__file__)), 'reference', 'lra_paper.json'
)


def paper() -> dict:
  """lra/reference/lra_paper.json (a fresh dict: callers may change it)."""
  with open(PAPER_JSON) as f:
    return json.load(f)


def paper_value(table1: dict, model: str, task: str) -> float | None:
  """The paper's Table 1 number of `model` on `task` (a column of
  table1['columns'], 'avg' included); None for a model, task (mqar) or
  cell it lacks."""
  ref = table1.get(model)
  if ref is None or task not in table1['columns']:
    return None
  return ref[table1['columns'].index(task)]


def lra_average(scores: dict[str, float]) -> float | None:
  """The LRA average: mean over the five tasks without Path-X, or None when
  one of them is missing from `scores` ({task: accuracy})."""
  vals = [scores.get(t) for t in TASK_COLUMNS[:5]]
  return None if any(v is None for v in vals) else float(np.mean(vals))
