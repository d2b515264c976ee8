"""What one training run is made of (lra/__init__.py: the floors)."""
