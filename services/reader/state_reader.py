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

import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, cast

import redis

from refold.contracts.layout import DEFAULT_KEY_PREFIX, GenerationKeys
from refold.contracts.store.connect import is_cluster, redis_client
from refold.contracts.store.generations import GenerationRegistry
from refold.contracts.store.positions import GenerationPositions, Positions
from refold.contracts.store.scan import scan_batches
from refold.services.errors import NoLiveGenerationError

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
            commands = plan(self.registry.keys(gen))
            keys = [self.registry.layout.alias, *(k for _, names in commands for k in names)]
            args = [gen, *(a for name, names in commands for a in (name, len(names)))]
            try:
                raw_live, *replies = self._script(keys=keys, args=args)
            except redis.exceptions.NoPermissionError:
                # A Redis user that may read but not run scripts: two round trips, below.
                self._script = None
                break
            if raw_live is None:
                raise self._no_live()
            live = int(raw_live)
            if live == gen:
                return gen, [
                    _as_hash(reply) if name == "HGETALL" else reply
                    for (name, _), reply in zip(commands, replies, strict=True)
                ]
            self._live = live  # flipped since the last read: read that one
        gen = self.live_generation() if generation is None else generation
        with self.client.pipeline(transaction=True) as pipe:
            for name, names in plan(self.registry.keys(gen)):
                pipe.execute_command(name, *names)  # type: ignore[no-untyped-call]
            return gen, pipe.execute()

    def get(self, table: str, key: str, generation: int | None = None) -> StateView:
        """One entity's state and the positions it reflects (read in one transaction)."""
        gen, (raw, raw_positions) = self._read(
            generation,
            lambda keys: [("GET", [keys.table(table, key)]), self._positions_read(keys)],
        )
        value = None if raw is None else json.loads(raw)
        return StateView(gen, value, self._positions(raw_positions))

    def get_many(self, table: str, keys: Sequence[str], generation: int | None = None) -> StateView:
        """Several entities from the same generation: ``value`` maps key -> state or None."""

        def plan(gen_keys: GenerationKeys) -> list[_Command]:
            values: list[_Command] = [("MGET", [gen_keys.table(table, k) for k in keys])]
            return [*(values if keys else []), self._positions_read(gen_keys)]

        gen, (*found, raw_positions) = self._read(generation, plan)
        raws = cast("list[bytes | None]", found[0] if keys else [])
        values = {k: None if r is None else json.loads(r) for k, r in zip(keys, raws, strict=True)}
        return StateView(gen, values, self._positions(raw_positions))

    def aggregate(self, name: str, generation: int | None = None) -> StateView:
        """An aggregate's counters as ``{name: int}``; counters at zero are left out."""
        gen, (raw, raw_positions) = self._read(
            generation,
            lambda keys: [("HGETALL", [keys.aggregate(name)]), self._positions_read(keys)],
        )
        counters = {k.decode(): int(v) for k, v in raw.items() if int(v) != 0}
        return StateView(gen, counters, self._positions(raw_positions))

    def _positions_read(self, keys: GenerationKeys) -> _Command:
        """The read of a generation's positions, beside its state (parsed by _positions)."""
        return ("HGETALL", [GenerationPositions(self.client, keys).key])

    def _positions(self, raw: dict[bytes, bytes]) -> Positions:
        """A positions hash parsed; the last one is kept, since most reads find it unchanged."""
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
        prefix = self.registry.keys(gen).table(table, "")
        for batch in scan_batches(self.client, self.registry.keys(gen).table_pattern(table)):
            yield from self._load(batch, prefix)

    def _load(self, names: list[str], prefix: str) -> Iterator[tuple[str, Any]]:
        for name, raw in zip(
            names, cast("list[bytes | None]", self.client.mget(names)), strict=True
        ):
            if raw is not None:
                yield name[len(prefix) :], json.loads(raw)
