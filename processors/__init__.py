"""Processors: Spark wiring and the domain folds."""
