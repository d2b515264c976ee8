"""The Long Range Arena harness: tasks (generators, readers, caches), batching,
training/eval steps, checkpoints and metrics. Imports nothing from models/."""
