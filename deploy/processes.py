"""Command-line helpers of the deploy commands (processes live in contracts.process_group)."""

from __future__ import annotations

import argparse
import shlex

__all__ = ["stop_hint", "tcp_port"]


def tcp_port(text: str) -> int:
    """An argparse type: a TCP port 1-65535 (a bad value is a usage error)."""
    try:
        port = int(text)
    except ValueError:
        port = 0
    if not 1 <= port <= 65535:
        msg = f"{text!r} is not a TCP port 1-65535"
        raise argparse.ArgumentTypeError(msg)
    return port


def stop_hint(command: str, state_dir: str) -> str:
    """The command line that stops what ``up`` started in ``state_dir``, to print after ``up``.

    ``command`` is the stopping command (``refold down``); ``--state-dir`` is added unless it
    is the default, ``.state``: a bare ``refold down`` looks there and finds nothing to stop.
    """
    if state_dir == ".state":
        return command
    return f"{command} --state-dir {shlex.quote(state_dir)}"
