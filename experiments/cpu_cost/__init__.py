"""CPU seconds and page faults per training step by malloc setting
(README.md)."""
