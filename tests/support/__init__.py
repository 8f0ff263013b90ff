"""Helpers shared by the test layers (no fixtures here; those live in conftest.py files)."""
