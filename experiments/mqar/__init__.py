"""The mqar study (README.md)."""
