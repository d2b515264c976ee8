"""The race against the PyTorch modules a user would otherwise pick
(README.md)."""
