"""The auto-pipeline packs commands byte for byte as redis-py does, and refuses what it refuses."""

from __future__ import annotations

import pytest
import redis
from redis.asyncio import Redis as AsyncRedis

from refold.contracts.store.autopipeline import _packed


def _connection(**options: str) -> object:
    """A connection of an asyncio client's pool, never connected (packing needs no socket)."""
    return AsyncRedis(**options).connection_pool.make_connection()


COMMANDS = [
    ("GET", "refold:order_state:g1:t:orders:k-1"),
    ("EVALSHA", "a" * 40, 3, "alias", "g1:t:orders:é", "g1:positions", 1, "GET", 1, "HGETALL", 1),
    ("SCRIPT LOAD", "return redis.call('GET', KEYS[1])"),
    ("SET", b"\x00\xff", 0.1 + 0.2, 10**20, -0.0, 1e-300),
    ("HSET", "h", "f", memoryview(b"view")),
]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[0])
def test_a_command_is_packed_as_redis_py_packs_it(command: tuple) -> None:
    connection = _connection()
    assert _packed(connection, [command]) == b"".join(connection.pack_commands([command]))


def test_a_batch_is_its_commands_in_order() -> None:
    connection = _connection()
    assert _packed(connection, COMMANDS) == b"".join(connection.pack_commands(COMMANDS))


@pytest.mark.parametrize("value", [True, None, 1j], ids=repr)
def test_what_redis_cannot_take_raises_redis_pys_error(value: object) -> None:
    with pytest.raises(redis.exceptions.DataError):
        _packed(_connection(), [("SET", "k", value)])


def test_a_bytearray_is_packed_as_its_bytes() -> None:
    connection = _connection()
    command = ("SET", "k", bytearray(b"raw"))
    assert _packed(connection, [command]) == b"".join(connection.pack_commands([command]))


def test_another_client_encoding_is_left_to_redis_py() -> None:
    connection = _connection(encoding="latin-1")
    command = ("SET", "k", "é")
    assert _packed(connection, [command]) == b"".join(connection.pack_commands([command]))
    assert b"\r\n\xe9\r\n" in _packed(connection, [command])
