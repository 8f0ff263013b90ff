"""Whether a generation readers see is still catching up from far behind the log (rebuilding).

A processor that starts a live generation from nothing (its first start, or Redis restarted
empty and it starts over from the log) serves readers while it folds the log again: an entity
not folded yet is missing, and one folded part way is an older version of itself. A reader must
say "rebuilding, ask again" there, not "not found". Normal lag (a live generation a few records
behind the log end in steady state) must stay "not found".

The distinction is recorded, not guessed from lag: the generation's meta field
:data:`CATCH_UP_FIELD` holds

* ``pending`` from the moment the processor creates a live generation until it has recorded
  where it starts (``record_starting_positions``): it has folded nothing;
* then the log end of each partition it starts behind (offsets JSON), taken when it starts;
  or the field is removed when it starts at the log end (nothing to catch up).

A generation is rebuilding while a position it has read is below that target (a reader compares
the positions it read with the value, so no broker is asked on the read path); once every
partition has reached it, it is live like any other, whatever its later lag, and the field is
inert. A generation created otherwise (a replay's shadow, which readers see only once it has
caught up; one created before this field existed) has no field and never reads as rebuilding.

Readers cache the field per generation for :data:`TTL_S`: one ``HGET`` a second per generation
at most, only for generations that are read (``pending`` is read again at every read: it lasts
the moment a processor takes to start).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import cast

import redis
from redis.asyncio import Redis as AsyncRedis

from refold.contracts.kafka.offsets_json import parse_offsets_json, to_offsets_json
from refold.contracts.layout import StateLayout
from refold.contracts.store.autopipeline import AutoPipeline

__all__ = [
    "CATCH_UP_FIELD",
    "CATCH_UP_PENDING",
    "TTL_S",
    "CatchUp",
    "CatchUpTargets",
    "catch_up_target",
]

CATCH_UP_FIELD = "catch_up_to"
CATCH_UP_PENDING = "pending"
TTL_S = 1.0

Positions = dict[tuple[str, int], int]


def catch_up_target(starts: Mapping[tuple[str, int], int], ends: Positions) -> Positions:
    """The log end of each partition a generation starts behind (pure); ``{}``: none."""
    return {tp: end for tp, end in sorted(ends.items()) if starts.get(tp, 0) < end}


def target_field(starts: Mapping[tuple[str, int], int], ends: Positions) -> str | None:
    """The field's value for a generation starting at ``starts`` (None: remove the field)."""
    target = catch_up_target(starts, ends)
    return to_offsets_json(target) if target else None


@dataclass(frozen=True, slots=True)
class CatchUp:
    """A generation's catch-up state as its meta records it.

    Attributes:
        pending: It has not recorded where it starts yet (it has folded nothing).
        target: The log end per partition it started behind (``{}``: nothing to catch up).
    """

    pending: bool = False
    target: Mapping[tuple[str, int], int] | None = None

    @classmethod
    def parse(cls, raw: bytes | str | None) -> CatchUp:
        """The field as stored (``HGET``'s reply)."""
        if raw is None:
            return _NONE
        text = raw.decode() if isinstance(raw, bytes) else raw
        if text == CATCH_UP_PENDING:
            return cls(pending=True)
        return cls(target=parse_offsets_json(text, lenient=True))

    def behind(self, positions: Mapping[tuple[str, int], int]) -> Positions | None:
        """The partitions still below the target, or None when the generation is not rebuilding.

        Only partitions in ``positions`` count: a sharded read holds its entity's shard only, and
        every event of the entity is on that partition. No positions at all: every partition of
        the target counts (nothing is applied yet).
        """
        if self.pending:
            return {}
        if not self.target:
            return None
        if not positions:
            return dict(self.target)
        late = {tp: end for tp, end in self.target.items() if positions.get(tp, end) < end}
        return late or None


_NONE = CatchUp()


class CatchUpTargets:
    """Each generation's :class:`CatchUp`, read at most once per :data:`TTL_S`.

    Safe to share between threads (two threads may read the field at once; both keep it).

    Args:
        client: redis-py client of the processor's Redis.
        layout: The processor's key layout.
    """

    def __init__(self, client: redis.Redis, layout: StateLayout) -> None:
        self.client = client
        self.layout = layout
        self._known: dict[int, tuple[float, CatchUp]] = {}

    def _cached(self, generation: int) -> CatchUp | None:
        hit = self._known.get(generation)
        # ``pending`` lasts a moment (a processor's start): read again until it is resolved.
        if hit is not None and not hit[1].pending and time.monotonic() - hit[0] < TTL_S:
            return hit[1]
        return None

    def _keep(self, generation: int, raw: bytes | str | None) -> CatchUp:
        state = CatchUp.parse(raw)
        self._known[generation] = (time.monotonic(), state)
        return state

    def of(self, generation: int) -> CatchUp:
        """The generation's catch-up state (one ``HGET`` when not cached)."""
        cached = self._cached(generation)
        if cached is not None:
            return cached
        meta = self.layout.generation(generation).meta
        raw = cast("bytes | None", self.client.hget(meta, CATCH_UP_FIELD))
        return self._keep(generation, raw)

    async def of_async(self, client: AsyncRedis | AutoPipeline, generation: int) -> CatchUp:
        """:meth:`of`, its round trip awaited on ``client``."""
        cached = self._cached(generation)
        if cached is not None:
            return cached
        meta = self.layout.generation(generation).meta
        raw = await client.execute_command("HGET", meta, CATCH_UP_FIELD)
        return self._keep(generation, raw)
