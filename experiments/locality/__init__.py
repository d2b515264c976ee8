"""The locality study (README.md)."""
