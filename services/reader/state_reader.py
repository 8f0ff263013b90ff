"""Read materialized state through the live-generation alias, with its freshness.

Readers never name a generation: each call resolves the alias once and reads that generation, so
a replay's cutover (one SET of the alias) switches readers between two calls, never within one.

On a single Redis a read is one round trip: the reader remembers the generation the alias named
last and reads the alias in the same transaction as that generation's keys; when the alias names
another generation (a flip happened), it reads again from that one. On a cluster the alias and a
generation's keys are in two slots, which no transaction spans: there a read resolves the alias
first, then reads the generation (two round trips).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, cast

import redis
from redis.asyncio import Redis as AsyncRedis
from redis.commands.core import Script

from refold.contracts.kafka.partitioner import key_partition
from refold.contracts.layout import DEFAULT_KEY_PREFIX, GenerationKeys
from refold.contracts.store.autopipeline import AutoPipeline
from refold.contracts.store.catch_up import CatchUp, CatchUpTargets
from refold.contracts.store.connect import is_cluster, redis_client
from refold.contracts.store.generations import GenerationRegistry
from refold.contracts.store.positions import GenerationPositions, Positions
from refold.contracts.store.scan import scan_batches
from refold.services.errors import NoLiveGenerationError, StateRebuildingError

__all__ = ["StateReader", "StateView"]

# A read: a command and its keys (``GET`` and ``HGETALL`` one key, ``MGET`` any number).
_Command = tuple[str, list[str]]

# KEYS[1] the alias, ARGV[1] the generation it should name; then, per read, ARGV its command
# and number of keys, taken from KEYS in order. Returns {alias} when the alias names another
# generation (or none), else {alias, reply of each read}. MGET is run as GETs: no unpack() of
# a batch of any size.
_READ_LIVE = """
local live = redis.call('GET', KEYS[1])
if live ~= ARGV[1] then return {live} end
local out, k = {live}, 2
for i = 2, #ARGV, 2 do
  local n = tonumber(ARGV[i + 1])
  if ARGV[i] == 'MGET' then
    local values = {}
    for j = 1, n do values[j] = redis.call('GET', KEYS[k + j - 1]) end
    out[#out + 1] = values
  else
    out[#out + 1] = redis.call(ARGV[i], KEYS[k])
  end
  k = k + n
end
return out
"""


def _as_hash(flat: list[Any]) -> dict[Any, Any]:
    """HGETALL's reply as a script returns it (a flat list) as redis-py's dict."""
    return dict(zip(flat[::2], flat[1::2], strict=True))


async def _run_script(
    client: AsyncRedis | AutoPipeline, script: Script, keys: list[str], args: list[Any]
) -> list[Any]:
    """``script`` on an asyncio client by its SHA, loaded first if Redis does not know it."""
    try:
        reply = await client.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)
    except redis.exceptions.NoScriptError:
        await client.execute_command("SCRIPT LOAD", script.script)
        reply = await client.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)
    return cast("list[Any]", reply)


@dataclass(frozen=True, slots=True)
class StateView:
    """State read from one generation, and how fresh it is.

    Attributes:
        generation: The generation it was read from.
        value: The state (``None`` if the entity does not exist); for ``get_many`` a dict.
        positions: Applied source positions of that generation: ``(topic, partition)`` -> next
            offset. Everything below those offsets is folded into ``value``.
    """

    generation: int
    value: Any
    positions: Positions


class StateReader:
    """Read-only access to one processor's tables.

    Keep one per processor and process where reads are frequent (the HTTP service does): it
    remembers the live generation between calls (always checked again, in the same transaction
    as the read) and checks the registry's key names once. Safe to share between threads.

    Args:
        client: redis-py client.
        processor: Processor name, e.g. ``order_state``.
        key_prefix: Prefix of refold's keys.
    """

    def __init__(
        self, client: redis.Redis, processor: str, key_prefix: str = DEFAULT_KEY_PREFIX
    ) -> None:
        self.client = client
        self.registry = GenerationRegistry.of(client, processor, key_prefix)
        # Reads the alias with a generation's keys in one command (not on a cluster, where
        # they are in two slots).
        self._script = None if is_cluster(client) else client.register_script(_READ_LIVE)
        # The generation the alias named at the last read: a guess each read checks.
        self._live: int | None = None
        # The last positions hash read, and its parse.
        self._last_positions: tuple[dict[bytes, bytes], Positions] | None = None
        # Which generations are still catching up from far behind the log (rebuilding).
        self._catch_up = CatchUpTargets(client, self.registry.layout)

    @classmethod
    def from_url(
        cls, url: str, processor: str, key_prefix: str = DEFAULT_KEY_PREFIX
    ) -> StateReader:
        """A reader with its own connection pool."""
        return cls(redis_client(url), processor, key_prefix)

    def live_generation(self) -> int:
        """The generation readers see now.

        Raises:
            NoLiveGenerationError: The processor has not run yet.
        """
        live = self.registry.live()
        if live is None:
            raise self._no_live()
        self._live = live
        return live

    def _no_live(self) -> NoLiveGenerationError:
        msg = (
            f"{self.registry.layout.processor} has no live generation yet. Operator "
            "action: start the processor (`refold process ...`)."
        )
        return NoLiveGenerationError(msg)

    def _read(
        self, generation: int | None, plan: Callable[[GenerationKeys], list[_Command]]
    ) -> tuple[int, list[Any]]:
        """Run ``plan``'s reads of one generation's keys at once; their replies, in order.

        ``generation`` None: the live one. On a single Redis, one script reads the alias and,
        if it still names the generation it named last, runs the reads (atomically, as a
        transaction would, in one command); if it names another, the reads run again on that
        one. So an answer is always of one generation, the one live when it was read.
        """
        while generation is None and self._script is not None and self._live is not None:
            gen = self._live
            commands, keys, args = self._script_request(gen, plan)
            try:
                reply = self._script(keys=keys, args=args)
            except redis.exceptions.NoPermissionError:
                # A Redis user that may read but not run scripts: two round trips, below.
                self._script = None
                break
            replies = self._script_replies(gen, commands, reply)
            if replies is not None:
                return gen, replies
        gen = self.live_generation() if generation is None else generation
        gen_keys = self.registry.keys(gen)
        with self.client.pipeline(transaction=self.registry.one_transaction(gen_keys)) as pipe:
            for name, names in plan(gen_keys):
                pipe.execute_command(name, *names)  # type: ignore[no-untyped-call]
            return gen, pipe.execute()

    def _script_request(
        self, gen: int, plan: Callable[[GenerationKeys], list[_Command]]
    ) -> tuple[list[_Command], list[str], list[Any]]:
        """``plan``'s reads of generation ``gen``, and the script's keys and arguments."""
        commands = plan(self.registry.keys(gen))
        keys = [self.registry.layout.alias, *(k for _, names in commands for k in names)]
        args = [gen, *(a for name, names in commands for a in (name, len(names)))]
        return commands, keys, args

    def _script_replies(
        self, gen: int, commands: list[_Command], reply: list[Any]
    ) -> list[Any] | None:
        """The script's replies to ``commands``; None when the alias names another generation.

        Raises:
            NoLiveGenerationError: The alias names none.
        """
        raw_live, *replies = reply
        if raw_live is None:
            raise self._no_live()
        live = int(raw_live)
        if live != gen:
            self._live = live  # flipped since the last read: the caller reads that one
            return None
        return [
            _as_hash(reply) if name == "HGETALL" else reply
            for (name, _), reply in zip(commands, replies, strict=True)
        ]

    def get(
        self, table: str, key: str, generation: int | None = None, *, raw: bool = False
    ) -> StateView:
        """One entity's state and the positions it reflects (read in one transaction).

        Of a sharded generation, the positions of the entity's shard: its partition id's, on
        which every event of the entity is (``GenerationKeys.shards``). ``raw``: the value as
        stored, its JSON text (bytes), not decoded.

        Raises:
            NoLiveGenerationError: The processor has no live generation yet.
            StateRebuildingError: The generation is catching up from far behind the log (its
                processor started it from nothing, e.g. after Redis restarted empty): the entity
                may be missing or older than it is. Not raised for a generation's normal lag.
        """
        view = self._entity(self._read(generation, self._entity_plan(table, key)), raw=raw)
        return self._complete(view, self._catch_up.of(view.generation))

    async def get_async(
        self,
        client: AsyncRedis | AutoPipeline,
        table: str,
        key: str,
        *,
        timeout_s: float | None = None,
        raw: bool = False,
    ) -> StateView:
        """:meth:`get` of the live generation, its round trip awaited on ``client``.

        For an event loop, which serves other requests meanwhile (a blocking call would hold
        it for the round trip). ``client`` is an asyncio client of the same Redis as this
        reader's, or an :class:`AutoPipeline` of one (concurrent reads share a round trip).
        The read is :meth:`get`'s one script, with the same check of the alias; what the
        script cannot answer runs :meth:`get` itself, blocking: a process's first read (no
        generation remembered yet), a Redis Cluster, a Redis user without scripts.

        Args:
            client: The asyncio client, or an auto-pipeline (which bounds its round trips
                itself: pass no ``timeout_s``).
            table: The table.
            key: The entity's key.
            timeout_s: The longest a round trip may take (None: ``client``'s own timeouts).
                One ``asyncio.timeout`` is cheaper than the client's socket timeout, which
                wraps each write in a task of its own (``asyncio.wait_for``).
            raw: The value as stored, its JSON text (bytes), not decoded: for an answer that
                embeds it as it is (``orjson.Fragment``).

        Raises:
            redis.exceptions.TimeoutError: Redis did not answer within ``timeout_s``.
            StateRebuildingError: As :meth:`get`.
        """
        plan = self._entity_plan(table, key)
        while self._script is not None and self._live is not None:
            gen = self._live
            commands, keys, args = self._script_request(gen, plan)
            try:
                if timeout_s is None:
                    reply = await _run_script(client, self._script, keys, args)
                else:
                    async with asyncio.timeout(timeout_s):
                        reply = await _run_script(client, self._script, keys, args)
            except redis.exceptions.NoPermissionError:
                self._script = None
                break
            except TimeoutError as exc:  # the client drops a connection cancelled mid-reply
                msg = f"Redis did not answer a read within {timeout_s} s"
                raise redis.exceptions.TimeoutError(msg) from exc
            replies = self._script_replies(gen, commands, reply)
            if replies is not None:
                view = self._entity((gen, replies), raw=raw)
                return self._complete(view, await self._catch_up.of_async(client, gen))
        return self.get(table, key, raw=raw)

    def _entity_plan(self, table: str, key: str) -> Callable[[GenerationKeys], list[_Command]]:
        """The reads of one entity: its value, and its shard's positions."""

        def plan(gen_keys: GenerationKeys) -> list[_Command]:
            shard = self._shard_of(gen_keys, key)
            return [("GET", [shard.table(table, key)]), *self._positions_reads(shard)]

        return plan

    def _entity(self, read: tuple[int, list[Any]], *, raw: bool = False) -> StateView:
        """The view of an entity's reads (:meth:`_entity_plan`); ``raw``: its value undecoded."""
        gen, (stored, *raw_positions) = read
        value = json.loads(stored) if stored is not None and not raw else stored
        return StateView(gen, value, self._positions(raw_positions))

    def get_many(self, table: str, keys: Sequence[str], generation: int | None = None) -> StateView:
        """Several entities from the same generation: ``value`` maps key -> state or None.

        Raises:
            StateRebuildingError: As :meth:`get` (a shard read that has caught up answers).
        """
        groups: list[list[str]] = []  # the keys of each MGET, in order

        def plan(gen_keys: GenerationKeys) -> list[_Command]:
            by_shard: dict[GenerationKeys, list[str]] = {}
            for k in keys:
                by_shard.setdefault(self._shard_of(gen_keys, k), []).append(k)
            groups[:] = list(by_shard.values())
            reads = [
                ("MGET", [at.table(table, k) for k in names]) for at, names in by_shard.items()
            ]
            shards = list(by_shard) or [gen_keys]
            return [*reads, *(r for at in shards for r in self._positions_reads(at))]

        gen, replies = self._read(generation, plan)
        values: dict[str, Any] = {}
        for names, raws in zip(groups, replies[: len(groups)], strict=True):
            for k, r in zip(names, cast("list[bytes | None]", raws), strict=True):
                values[k] = None if r is None else json.loads(r)
        found = {k: values[k] for k in keys}
        view = StateView(gen, found, self._positions(replies[len(groups) :]))
        return self._complete(view, self._catch_up.of(gen))

    def aggregate(self, name: str, generation: int | None = None) -> StateView:
        """An aggregate's counters as ``{name: int}``; counters at zero are left out.

        A sharded generation's counters are kept per shard and added up here.

        Raises:
            StateRebuildingError: As :meth:`get`: the counters are partial.
        """

        def plan(gen_keys: GenerationKeys) -> list[_Command]:
            shards = gen_keys.each_shard()
            reads: list[_Command] = [("HGETALL", [k.aggregate(name)]) for k in shards]
            return [*reads, *(r for k in shards for r in self._positions_reads(k))]

        gen, replies = self._read(generation, plan)
        half = len(replies) // 2
        counters: dict[str, int] = {}
        for raw in replies[:half]:
            for k, v in raw.items():
                counters[k.decode()] = counters.get(k.decode(), 0) + int(v)
        value = {k: v for k, v in counters.items() if v != 0}
        view = StateView(gen, value, self._positions(replies[half:]))
        return self._complete(view, self._catch_up.of(gen))

    def _complete(self, view: StateView, catch_up: CatchUp) -> StateView:
        """``view``, unless its generation is still catching up from far behind the log.

        Raises:
            StateRebuildingError: It is (:mod:`refold.contracts.store.catch_up`).
        """
        behind = catch_up.behind(view.positions)
        if behind is None:
            return view
        raise StateRebuildingError(
            self.registry.layout.processor, view.generation, view.positions, behind
        )

    @staticmethod
    def _shard_of(keys: GenerationKeys, entity: str) -> GenerationKeys:
        """The keys of the shard an entity is in: its Kafka partition's (unsharded: ``keys``)."""
        return keys.for_shard(key_partition(entity, keys.shards)) if keys.shards else keys

    def _positions_reads(self, keys: GenerationKeys) -> list[_Command]:
        """The reads of positions beside state (parsed by _positions): a shard's, or all."""
        return [("HGETALL", [h]) for h in keys.positions_hashes()]

    def _positions(self, raws: Sequence[dict[bytes, bytes]]) -> Positions:
        """Positions hashes parsed; the last one is kept, since most reads find it unchanged."""
        if len(raws) != 1:
            return GenerationPositions.parse_replies(raws).positions
        raw = raws[0]
        last = self._last_positions
        if last is None or last[0] != raw:
            last = self._last_positions = (raw, GenerationPositions.parse(raw).positions)
        return dict(last[1])

    def freshness(self, generation: int | None = None) -> Positions:
        """Applied positions of the (live) generation."""
        gen = self.live_generation() if generation is None else generation
        return self.registry.positions_of(gen).read().positions

    def scan(self, table: str, generation: int | None = None) -> Iterator[tuple[str, Any]]:
        """Every entity of a table as ``(key, state)``, in no particular order."""
        gen = self.live_generation() if generation is None else generation
        for keys in self.registry.keys(gen).each_shard():
            prefix = keys.table(table, "")
            for batch in scan_batches(self.client, keys.table_pattern(table)):
                yield from self._load(batch, prefix)

    def _load(self, names: list[str], prefix: str) -> Iterator[tuple[str, Any]]:
        for name, raw in zip(
            names, cast("list[bytes | None]", self.client.mget(names)), strict=True
        ):
            if raw is not None:
                yield name[len(prefix) :], json.loads(raw)
