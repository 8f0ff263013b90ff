"""Benchmarks of refold on the embedded local stack (``python -m bench``)."""
