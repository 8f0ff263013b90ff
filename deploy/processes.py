"""Command-line helpers of the deploy commands (processes live in contracts.process_group)."""

from __future__ import annotations

import argparse

__all__ = ["tcp_port"]


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
