"""Read materialized state through the live-generation alias, with its freshness.

Readers never name a generation: each call resolves the alias once and reads that generation, so
a replay's cutover (one SET of the alias) switches readers between two calls, never within one.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, cast

import redis

from refold.contracts.layout import DEFAULT_KEY_PREFIX
from refold.contracts.store.connect import pipelined_mget, redis_client
from refold.contracts.store.generations import GenerationRegistry, Positions
from refold.contracts.store.scan import scan_batches
from refold.services.errors import NoLiveGenerationError

__all__ = ["StateReader", "StateView"]


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
            msg = (
                f"{self.registry.layout.processor} has no live generation yet. Operator "
                "action: start the processor (`refold process ...`)."
            )
            raise NoLiveGenerationError(msg)
        return live

    def get(self, table: str, key: str, generation: int | None = None) -> StateView:
        """One entity's state and the positions it reflects (read in one transaction)."""
        gen = self.live_generation() if generation is None else generation
        keys = self.registry.keys(gen)
        with self.client.pipeline(transaction=True) as pipe:
            pipe.get(keys.table(table, key))
            pipe.hgetall(keys.positions)
            raw, raw_positions = pipe.execute()
        positions, _batch_id = self.registry.parse_positions(raw_positions)
        return StateView(gen, None if raw is None else json.loads(raw), positions)

    def get_many(self, table: str, keys: Sequence[str], generation: int | None = None) -> StateView:
        """Several entities from the same generation: ``value`` maps key -> state or None."""
        gen = self.live_generation() if generation is None else generation
        names = [self.registry.keys(gen).table(table, k) for k in keys]
        with self.client.pipeline(transaction=True) as pipe:  # values and positions at once
            if names:
                pipelined_mget(pipe, names)
            pipe.hgetall(self.registry.keys(gen).positions)
            *found, raw_positions = pipe.execute()
        raws = cast("list[bytes | None]", found[0] if names else [])
        values = {k: None if r is None else json.loads(r) for k, r in zip(keys, raws, strict=True)}
        return StateView(gen, values, self.registry.parse_positions(raw_positions)[0])

    def aggregate(self, name: str, generation: int | None = None) -> StateView:
        """An aggregate's counters as ``{name: int}``; counters at zero are left out."""
        gen = self.live_generation() if generation is None else generation
        keys = self.registry.keys(gen)
        with self.client.pipeline(transaction=True) as pipe:  # counters and positions at once
            pipe.hgetall(keys.aggregate(name))
            pipe.hgetall(keys.positions)
            raw, raw_positions = pipe.execute()
        counters = {k.decode(): int(v) for k, v in raw.items() if int(v) != 0}
        return StateView(gen, counters, self.registry.parse_positions(raw_positions)[0])

    def freshness(self, generation: int | None = None) -> Positions:
        """Applied positions of the (live) generation."""
        gen = self.live_generation() if generation is None else generation
        return self.registry.positions(gen)[0]

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
