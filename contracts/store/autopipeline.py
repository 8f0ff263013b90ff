"""Auto-pipelining: commands that concurrent tasks of one event loop await go to Redis together.

An HTTP worker holds several reads at once (one per connection in flight). Each awaiting its own
round trip costs a write system call, a connection taken from the pool and given back, and a
timeout per read. :class:`AutoPipeline` queues the commands awaited in one turn of the event loop
and writes them at once on one connection (no transaction: one write, the replies read in order),
then hands each task its own reply. Under load a worker's reads share one round trip; alone, a
read is sent one loop turn later (microseconds).

It is built on redis-py's asyncio connections, not on a protocol of its own: the pool, the
parsing (hiredis) and the replies' callbacks are redis-py's. It skips redis-py's ``Pipeline``
object around them: its retry wrapper, command stack and per-batch hooks cost about a tenth of
an entity read's CPU in the HTTP worker (measured in process). Commands are packed by hiredis
(:func:`_packed`), which redis-py itself calls, but after its own pass in Python over every
argument. A command's error (a Redis error reply) goes to its own task only; a failure of the
round trip (Redis unreachable, no answer within the timeout) goes to every task of the batch,
and the next batch takes a connection the pool checks (a Redis restarted meanwhile is
reconnected to).
"""

from __future__ import annotations

import asyncio
from typing import Any

import hiredis
import redis
from redis.asyncio import Redis as AsyncRedis
from redis.asyncio.connection import AbstractConnection

__all__ = ["AutoPipeline"]


class AutoPipeline:
    """The commands of one event loop's tasks, sent together.

    Make one per asyncio client and loop, and use it from that loop only.

    Args:
        client: The asyncio client whose pool sends the batches (several batches may be in
            flight at once, each on a connection of its own).
        timeout_s: The longest a batch's round trip may take; past it every command of the
            batch raises ``redis.exceptions.TimeoutError``.
    """

    def __init__(self, client: AsyncRedis, timeout_s: float) -> None:
        self.client = client
        self.timeout_s = timeout_s
        self._queued: list[tuple[tuple[Any, ...], asyncio.Future[Any]]] = []
        self._sending: set[asyncio.Task[None]] = set()  # strong references to running batches

    async def execute_command(self, *args: Any) -> Any:
        """Send ``args`` (a command and its arguments) with the others of this loop turn.

        Returns:
            Its reply, as redis-py parses it.

        Raises:
            redis.exceptions.ResponseError: Redis answered this command with an error.
            redis.exceptions.RedisError: The batch's round trip failed or timed out.
        """
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._queued.append((args, future))
        if len(self._queued) == 1:
            # After the tasks ready in this turn have queued theirs (they run before it).
            loop.call_soon(self._flush)
        return await future

    def _flush(self) -> None:
        batch, self._queued = self._queued, []
        task = asyncio.get_running_loop().create_task(self._send(batch))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _send(self, batch: list[tuple[tuple[Any, ...], asyncio.Future[Any]]]) -> None:
        try:
            async with asyncio.timeout(self.timeout_s):
                replies = await self._round_trip([args for args, _ in batch])
        except TimeoutError:
            msg = f"Redis did not answer within {self.timeout_s} s"
            self._fail(batch, redis.exceptions.TimeoutError(msg))
            return
        except BaseException as exc:  # every task waits for an answer: give it the failure
            self._fail(batch, exc)
            if not isinstance(exc, Exception):
                raise
            return
        for (_, future), reply in zip(batch, replies, strict=True):
            if future.done():  # its task was cancelled meanwhile
                continue
            if isinstance(reply, redis.exceptions.ResponseError):
                future.set_exception(reply)
            else:
                future.set_result(reply)

    async def _round_trip(self, commands: list[tuple[Any, ...]]) -> list[Any]:
        """``commands`` written at once on a connection of the pool; their replies, in order.

        What redis-py's pipeline does for a batch, without its layers (module docstring). A
        command's error reply is its reply.
        """
        pool = self.client.connection_pool
        connection = await pool.get_connection()  # type: ignore[no-untyped-call]
        try:
            await connection.send_packed_command(_packed(connection, commands), check_health=False)
            replies: list[Any] = []
            for args in commands:
                try:
                    replies.append(await self.client.parse_response(connection, args[0]))
                except redis.exceptions.ResponseError as exc:
                    replies.append(exc)
        except BaseException:
            # Replies may be left unread on the socket: no later batch may use it.
            await connection.disconnect(nowait=True)
            raise
        finally:
            await pool.release(connection)
        return replies

    @staticmethod
    def _fail(batch: list[tuple[tuple[Any, ...], asyncio.Future[Any]]], exc: BaseException) -> None:
        for _, future in batch:
            if not future.done():
                if isinstance(exc, asyncio.CancelledError):
                    future.cancel()
                else:
                    future.set_exception(exc)


def _packed(connection: AbstractConnection, commands: list[tuple[Any, ...]]) -> bytes:
    """``commands`` in Redis's protocol, as redis-py's ``pack_commands`` packs them.

    hiredis packs str (UTF-8), bytes, int and float (``repr``) arguments itself. redis-py's
    packer calls it too, but after encoding each argument in Python: 11.7 us against 1.6 for
    an entity read's script call (11 arguments), ~7% of the read. A command name of two words
    (``SCRIPT LOAD``) is split, as redis-py splits it. What hiredis refuses (a bool, None, a
    bytearray) and a client encoding other than strict UTF-8 are left to redis-py's packer,
    and its errors.
    """
    encoder = connection.encoder
    if (encoder.encoding, encoder.encoding_errors) != ("utf-8", "strict"):
        return b"".join(connection.pack_commands(commands))
    packed = []
    for name, *args in commands:
        try:
            packed.append(hiredis.pack_command((*name.split(), *args)))
        except (TypeError, AttributeError):
            packed.extend(connection.pack_commands([(name, *args)]))
    return b"".join(packed)
