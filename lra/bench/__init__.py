"""Measures one training step or one attention layer: steps/s, peak memory,
compile time; each cell in its own process so one out-of-memory cell does
not end the table.

  main.py     the command line (`lra-benchmark`, `python benchmark.py`)
  cells.py    what a cell is: its spec, its config, its row
  measure.py  one cell's training step: speed, memory, FLOPs; --mode loop
  isolate.py  each cell in its own process, killed past its deadline
  layer.py    one attention layer alone (`--layer`)
  report.py   the Markdown table and plots beside the paper's Table 2

The CPU cost per step by malloc setting and the race against PyTorch
modules are studies: experiments/cpu_cost/, experiments/race/.
"""
