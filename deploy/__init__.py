"""Deployment: the local stack, the demo, test-data simulators and the ``refold`` command."""
