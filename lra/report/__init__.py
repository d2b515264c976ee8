"""What reads finished runs: the accuracy table beside the paper's (tables.py,
paper.py), training curves (curves.py) and the plot style every figure of the
project uses (plotstyle.py)."""
