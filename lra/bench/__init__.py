"""Measures one training step or one attention layer: steps/s, peak memory,
compile time; each cell in its own process so one out-of-memory cell does
not end the table.

  main.py    the command line (`lra-benchmark`, `python benchmark.py`)
  layer.py   one attention layer alone (`--layer`)
  report.py  the Markdown table and plots beside the paper's Table 2
"""
