"""Measures one training step or one attention layer: steps/s, peak memory,
compile time; each cell in its own process so one out-of-memory cell does
not end the table.

  main.py     the command line (`lra-benchmark`, `python benchmark.py`)
  cells.py    what a cell is: its spec, its config, its row
  measure.py  one cell's training step: speed, memory, FLOPs; --mode loop
  isolate.py  each cell in its own process, killed past its deadline
  layer.py    one attention layer alone (`--layer`)
  report.py   the Markdown table and plots beside the paper's Table 2
  cpu_cost.py CPU seconds and page faults per step by malloc setting
              (`python -m lra.bench.cpu_cost`; lra/allocator.py)
  race.py     one attention layer against the PyTorch module a user would
              pick (`python -m lra.bench.race`; needs torch)
"""
