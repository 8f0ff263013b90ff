"""Generations of a processor's state in Redis: create, list, read positions, flip the alias.

Shared by processors (which create and write generations), replay (which builds a new one and
flips readers to it) and the reader (which resolves the live one). Only standard Redis commands.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any, cast

import redis
from redis.typing import EncodableT, FieldT

from contracts.errors import RefoldError
from contracts.state import (
    BATCH_ID_FIELD,
    GenerationKeys,
    GenerationStatus,
    StateLayout,
    parse_position_field,
)

__all__ = ["GenerationInfo", "GenerationRegistry", "Positions"]

Positions = dict[tuple[str, int], int]


@dataclass(frozen=True, slots=True)
class GenerationInfo:
    """One generation as the registry knows it."""

    generation: int
    status: GenerationStatus
    meta: dict[str, str]


def _decode(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class GenerationRegistry:
    """The generations of one processor.

    Args:
        client: A redis-py client.
        layout: The processor's key layout.
    """

    def __init__(self, client: redis.Redis, layout: StateLayout) -> None:
        self.client = client
        self.layout = layout

    def keys(self, generation: int) -> GenerationKeys:
        """Key names of one generation."""
        return self.layout.generation(generation)

    def live(self) -> int | None:
        """The generation readers see, or ``None`` before the first one exists."""
        value = self.client.get(self.layout.alias)
        return None if value is None else int(_decode(cast("bytes", value)))

    def list(self) -> list[GenerationInfo]:
        """Every generation, oldest first."""
        raw = cast("dict[bytes, bytes]", self.client.hgetall(self.layout.generations))
        result = []
        for gen_raw, status in sorted(raw.items(), key=lambda kv: int(kv[0])):
            generation = int(gen_raw)
            meta = cast("dict[bytes, bytes]", self.client.hgetall(self.keys(generation).meta))
            result.append(
                GenerationInfo(
                    generation,
                    cast("GenerationStatus", _decode(status)),
                    {_decode(k): _decode(v) for k, v in meta.items()},
                )
            )
        return result

    def meta(self, generation: int) -> dict[str, str]:
        """The metadata hash of one generation (empty if it does not exist)."""
        raw = cast("dict[bytes, bytes]", self.client.hgetall(self.keys(generation).meta))
        return {_decode(k): _decode(v) for k, v in raw.items()}

    def update_meta(self, generation: int, fields: dict[str, str]) -> None:
        """Set metadata fields of one generation."""
        if fields:
            mapping: dict[FieldT, EncodableT] = dict(fields.items())
            self.client.hset(self.keys(generation).meta, mapping=mapping)

    def status(self, generation: int) -> GenerationStatus | None:
        """Status of one generation, ``None`` if it does not exist."""
        value = self.client.hget(self.layout.generations, str(generation))
        return None if value is None else cast("GenerationStatus", _decode(cast("bytes", value)))

    def create(self, meta: dict[str, Any], *, live: bool = False) -> int:
        """Register a new generation with the next free number.

        Args:
            meta: Recorded in the generation's meta hash (non-strings are stored as JSON).
            live: Make it live at once (only for a processor's very first generation).

        Returns:
            The new generation number.
        """
        while True:
            taken = [
                int(g) for g in cast("list[bytes]", self.client.hkeys(self.layout.generations))
            ]
            generation = max(taken, default=0) + 1
            status: GenerationStatus = "live" if live else "building"
            if self.client.hsetnx(self.layout.generations, str(generation), status):
                break
        fields: dict[FieldT, EncodableT] = {
            "created_at": str(int(time.time() * 1000)),
            **{
                k: v if isinstance(v, str) else json.dumps(v, sort_keys=True)
                for k, v in meta.items()
            },
        }
        self.client.hset(self.keys(generation).meta, mapping=fields)
        if live:
            self.client.set(self.layout.alias, str(generation))
        return generation

    def positions(self, generation: int) -> tuple[Positions, int | None]:
        """Applied positions (next offset per topic partition) and the last batch id."""
        raw = cast("dict[bytes, bytes]", self.client.hgetall(self.keys(generation).positions))
        return self.parse_positions(raw)

    @staticmethod
    def parse_positions(raw: dict[bytes, bytes]) -> tuple[Positions, int | None]:
        """Parse a positions hash as returned by HGETALL."""
        positions: Positions = {}
        batch_id = None
        for field_raw, value in raw.items():
            field = _decode(field_raw)
            if field == BATCH_ID_FIELD:
                batch_id = int(value)
                continue
            parsed = parse_position_field(field)
            if parsed is not None:
                positions[parsed] = int(value)
        return positions, batch_id

    def flip(self, generation: int, *, record_replaced: bool = True) -> int | None:
        """Make ``generation`` live in one transaction; the previous live one is retired.

        ``record_replaced`` notes the previous generation in the new one's metadata, which is
        what ``replay rollback`` flips back to (a rollback itself does not record it).

        Readers resolve the alias with one GET, so they see either the old or the new generation,
        never a mix.

        Returns:
            The generation that was live before.

        Raises:
            RefoldError: ``generation`` does not exist.
        """
        if self.status(generation) is None:
            msg = f"{self.layout.processor} has no generation {generation}"
            raise RefoldError(msg)
        previous = self.live()
        with self.client.pipeline(transaction=True) as pipe:
            pipe.set(self.layout.alias, str(generation))
            if previous is not None and previous != generation:
                pipe.hset(self.layout.generations, str(previous), "retired")
            pipe.hset(self.layout.generations, str(generation), "live")
            pipe.hset(self.keys(generation).meta, "live_since", str(int(time.time() * 1000)))
            if record_replaced and previous is not None and previous != generation:
                pipe.hset(self.keys(generation).meta, "replaced", str(previous))
            pipe.execute()
        return previous
