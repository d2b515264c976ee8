"""The device study (README.md)."""
