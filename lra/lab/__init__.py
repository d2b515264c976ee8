"""What runs or reads many trainings (lra/__init__.py: the floors)."""
