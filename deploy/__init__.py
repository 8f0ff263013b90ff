"""Deployment: the embedded local stack, the demo and the ``refold`` command."""
