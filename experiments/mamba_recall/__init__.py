"""The mamba_recall study (README.md)."""
