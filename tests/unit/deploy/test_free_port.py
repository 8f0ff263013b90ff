"""free_port: a loopback port free now, below the range the kernel gives outgoing connections."""

from __future__ import annotations

import socket
from pathlib import Path

from refold.deploy.local_stack import free_port


def test_a_free_port_is_bindable_and_below_the_ephemeral_range():
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = {free_port() for _ in range(20)}
    assert len(ports) > 1  # drawn at random, not the same one each time
    for port in ports:
        assert 1024 < port < low
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))  # free: nothing listens there


def test_a_port_taken_by_a_listener_is_not_given():
    taken = []
    try:
        for _ in range(5):
            sock = socket.socket()
            sock.bind(("127.0.0.1", free_port()))
            sock.listen()
            taken.append(sock)
        assert not {free_port() for _ in range(50)} & {s.getsockname()[1] for s in taken}
    finally:
        for sock in taken:
            sock.close()
