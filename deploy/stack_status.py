"""``refold status``'s verdict: which servers of the local stack are down, and the exit code.

A server is up when its recorded process runs *and* its port accepts a connection; a process
that runs but does not listen (still starting, or wedged) is down too. The exit code lets a
script tell a whole stack from a part of one (docs/commands.md):

* **0**: every server (Kafka, Redis or every Redis Cluster node) is up;
* **3**: nothing runs (no server's process), as before;
* **6**: part of the stack is down; stderr names each part and its port.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from refold.deploy.local_stack import ServerStatus

__all__ = ["EXIT_NOTHING_RUNS", "EXIT_PART_DOWN", "StackVerdict", "port_answers", "stack_verdict"]

EXIT_NOTHING_RUNS = 3
EXIT_PART_DOWN = 6


def port_answers(port: int, timeout_s: float = 0.5) -> bool:
    """True if something accepts a TCP connection on ``127.0.0.1:port``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout_s)
        return sock.connect_ex(("127.0.0.1", port)) == 0


@dataclass(frozen=True, slots=True)
class StackVerdict:
    """What ``refold status`` concludes.

    Attributes:
        states: Per server, in ``status()`` order: ``running (pid N)``, ``not answering (pid N)``
            or ``stopped``.
        down: The parts that are down, ``name (port P)``, in the same order.
        exit_code: 0, :data:`EXIT_NOTHING_RUNS` or :data:`EXIT_PART_DOWN`.
    """

    states: tuple[str, ...]
    down: tuple[str, ...]
    exit_code: int

    def message(self, start_hint: str = "refold up") -> str:
        """The stderr line of a stack that is not whole ("" when it is)."""
        if self.exit_code == 0:
            return ""
        if self.exit_code == EXIT_NOTHING_RUNS:
            return f"refold status: the local stack is stopped. Operator action: {start_hint}"
        return (
            f"refold status: down: {', '.join(self.down)}. Operator action: "
            f"{start_hint} (it starts what is down; what runs is left as it is)"
        )


def stack_verdict(
    servers: Sequence[ServerStatus], answers: Callable[[int], bool] = port_answers
) -> StackVerdict:
    """Decide what is down (``answers(port)`` is asked only of servers whose process runs)."""
    states: list[str] = []
    down: list[str] = []
    for server in servers:
        if not server.running:
            states.append("stopped")
        elif answers(server.port):
            states.append(f"running (pid {server.pid})")
            continue
        else:
            states.append(f"not answering (pid {server.pid})")
        down.append(f"{server.name} (port {server.port})")
    if not any(server.running for server in servers):
        code = EXIT_NOTHING_RUNS
    else:
        code = EXIT_PART_DOWN if down else 0
    return StackVerdict(tuple(states), tuple(down), code)
