"""Processing stats of a generation: what its micro-batches did, for ``/metrics`` and dashboards.

What the records did (``events``, ``duplicates``, ``effects``, ``dead:<reason>``) is counted in
the transaction that applies them (:func:`count_outcome`: exact through kill -9s and re-run
batches). What the batches did (their count, durations, the watermark) is written by the Spark
driver after each micro-batch (:meth:`ProcessorStats.record_batch`, best effort). Read by the
services (:meth:`ProcessorStats.read`). One hash per generation,
:attr:`refold.contracts.layout.GenerationKeys.stats`:

=====================  ===========================================================================
field                  content
=====================  ===========================================================================
``batches``            micro-batches counted
``events``             records applied (folded, archived; a DataFrame processor: records read)
``duplicates``         records skipped as re-sent by their upstream
``expired``            entities the state TTL removed (``state_ttl``, on event time)
``effects``            outputs produced (side effects, emitted records)
``dead:<reason>``      dead letters by reason (``rejected``, ``bad-body``, ``late``...)
``dur_le:<ms>``        cumulative histogram of batch durations: batches that took at most ``ms``
                       (bounds :data:`DURATION_BOUNDS_MS`, and ``+Inf``)
``dur_sum_ms``         total batch duration
``last_batch_id``      Spark batch id of the last batch counted
``last_batch_at``      when it was counted (epoch ms)
``checkpoint_id``      the Spark checkpoint's query id the batch ids belong to
``watermark_ms``       the generation's event-time watermark after the last batch (processors
                       with an event time, once every partition has a clock)
=====================  ===========================================================================

Once per batch: one Lua call adds a batch's counts only if its batch id is above
``last_batch_id`` of the same checkpoint, so a batch Spark runs again after a restart is not
counted twice. A new checkpoint (a lost one, an in-place reset's new epoch) starts its batch ids
at 0 again; its batches count from its first one.

The stats are not state: snapshots and ``replay diff`` leave them out, ``replay gc`` removes them
with their generation, an in-place reset deletes them.

Lifecycle: a :class:`ProcessorStats` is cheap; the redis-py client it is given may be shared
between threads.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

import redis

from refold.contracts.layout import StateLayout
from refold.contracts.store.generations import GenerationRegistry

if TYPE_CHECKING:
    from redis.client import Pipeline

__all__ = [
    "DURATION_BOUNDS_MS",
    "BatchStats",
    "ProcessorStats",
    "batch_increments",
    "count_outcome",
    "outcome_increments",
    "parse_stats",
]

# Upper bounds (ms) of the batch-duration histogram: from a small trigger's batch (tens of ms)
# to a large catch-up batch (tens of seconds), roughly x2.5 apart like Prometheus' defaults.
DURATION_BOUNDS_MS: tuple[int, ...] = (50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000)
_INF = "+Inf"
_DEAD, _DUR_LE = "dead:", "dur_le:"

# KEYS[1]: the stats hash. ARGV: checkpoint id, batch id, now (ms), n, then n (field, amount)
# pairs to add, then (field, value) pairs to set. 0 when the batch was counted already.
_RECORD = """
local last = redis.call('HGET', KEYS[1], 'last_batch_id')
local scope = redis.call('HGET', KEYS[1], 'checkpoint_id') or ''
if last and scope == ARGV[1] and tonumber(ARGV[2]) <= tonumber(last) then
  return 0
end
local n = tonumber(ARGV[4])
for i = 0, n - 1 do
  redis.call('HINCRBY', KEYS[1], ARGV[5 + 2 * i], ARGV[6 + 2 * i])
end
for i = 5 + 2 * n, #ARGV, 2 do
  redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
end
redis.call('HSET', KEYS[1], 'last_batch_id', ARGV[2], 'last_batch_at', ARGV[3],
  'checkpoint_id', ARGV[1])
return 1
"""


@dataclass(frozen=True, slots=True)
class BatchStats:
    """A generation's stats hash, parsed (all zero when it has none).

    Attributes:
        batches: Micro-batches counted.
        events: Records applied.
        duplicates: Records skipped as re-sent by their upstream.
        effects: Outputs produced.
        dead_letters: Dead letters by reason.
        expired: Entities the state TTL removed.
        duration_buckets: ``(upper bound ms, batches at most that long)``, cumulative,
            ascending, the last bound ``math.inf``.
        duration_sum_ms: Total batch duration.
        last_batch_id: Spark batch id of the last batch counted.
        last_batch_at: When it was counted (epoch ms).
        watermark_ms: Event-time watermark after the last batch, if the processor has one.
        checkpoint_id: The Spark checkpoint the batch ids belong to.
    """

    batches: int = 0
    events: int = 0
    duplicates: int = 0
    effects: int = 0
    dead_letters: Mapping[str, int] = field(default_factory=dict)
    duration_buckets: tuple[tuple[float, int], ...] = ()
    duration_sum_ms: int = 0
    last_batch_id: int | None = None
    last_batch_at: int | None = None
    watermark_ms: int | None = None
    checkpoint_id: str = ""
    expired: int = 0

    @property
    def dead_letters_total(self) -> int:
        """Dead letters of every reason."""
        return sum(self.dead_letters.values())

    @property
    def mean_duration_ms(self) -> float | None:
        """Mean batch duration (None before the first batch)."""
        return self.duration_sum_ms / self.batches if self.batches else None


def outcome_increments(
    events: int,
    duplicates: int,
    effects: int,
    dead_letters: Mapping[str, int],
    expired: int = 0,
) -> list[tuple[str, int]]:
    """The counters of what records did: applied, re-sent, outputs, expired, dead letters (pure).

    Zeros are left out.
    """
    pairs = [("events", events), ("duplicates", duplicates), ("effects", effects)]
    pairs.append(("expired", expired))
    pairs += [(_DEAD + reason, n) for reason, n in sorted(dead_letters.items())]
    return [(name, amount) for name, amount in pairs if amount]


def count_outcome(
    pipe: Pipeline,
    stats_key: str,
    *,
    events: int = 0,
    duplicates: int = 0,
    effects: int = 0,
    dead_letters: Mapping[str, int] | None = None,
    expired: int = 0,
) -> None:
    """Queue a transaction's counts on ``pipe``, inside its ``MULTI``.

    The engines count their records this way, in the transaction that applies them and moves
    their positions, so the counts are exact: a transaction that does not commit counts nothing,
    one that commits counts once, and a Redis that lost writes lost their counts with them.
    """
    counts = outcome_increments(events, duplicates, effects, dead_letters or {}, expired)
    for name, amount in counts:
        pipe.hincrby(stats_key, name, amount)


def batch_increments(
    events: int,
    duplicates: int,
    effects: int,
    dead_letters: Mapping[str, int],
    duration_ms: float,
) -> list[tuple[str, int]]:
    """The counters one batch adds to the stats hash (pure).

    Args:
        events: Records applied.
        duplicates: Records skipped as re-sent.
        effects: Outputs produced.
        dead_letters: Dead letters by reason (zeros are left out).
        duration_ms: The batch's wall time.

    Returns:
        ``(field, amount)`` pairs, for ``HINCRBY``.
    """
    spent = max(0, round(duration_ms))
    pairs = [("batches", 1), ("events", events), ("duplicates", duplicates), ("effects", effects)]
    pairs += [(_DEAD + reason, n) for reason, n in sorted(dead_letters.items()) if n]
    pairs += [(f"{_DUR_LE}{bound}", 1) for bound in DURATION_BOUNDS_MS if spent <= bound]
    pairs += [(_DUR_LE + _INF, 1), ("dur_sum_ms", spent)]
    return pairs


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _int(value: str | None) -> int | None:
    return None if value is None else int(value)


def parse_stats(raw: Mapping[bytes, bytes] | Mapping[str, str]) -> BatchStats:
    """Parse a stats hash as ``HGETALL`` returns it (pure; unknown fields are ignored).

    Every standard bound of the histogram is present, 0 where no batch was that fast.
    """
    fields = {_text(k): _text(v) for k, v in raw.items()}
    dead = {k[len(_DEAD) :]: int(v) for k, v in fields.items() if k.startswith(_DEAD)}
    buckets: dict[float, int] = {float(b): 0 for b in DURATION_BOUNDS_MS}
    batches = int(fields.get("batches", "0"))
    buckets[math.inf] = batches
    for name, value in fields.items():
        if name.startswith(_DUR_LE):
            bound = name[len(_DUR_LE) :]
            buckets[math.inf if bound == _INF else float(bound)] = int(value)
    return BatchStats(
        batches=batches,
        events=int(fields.get("events", "0")),
        duplicates=int(fields.get("duplicates", "0")),
        effects=int(fields.get("effects", "0")),
        expired=int(fields.get("expired", "0")),
        dead_letters=dict(sorted(dead.items())),
        duration_buckets=tuple(sorted(buckets.items())),
        duration_sum_ms=int(fields.get("dur_sum_ms", "0")),
        last_batch_id=_int(fields.get("last_batch_id")),
        last_batch_at=_int(fields.get("last_batch_at")),
        watermark_ms=_int(fields.get("watermark_ms")),
        checkpoint_id=fields.get("checkpoint_id", ""),
    )


class ProcessorStats:
    """The stats hashes of one processor's generations.

    Args:
        client: A redis-py client.
        layout: The processor's key layout.
    """

    def __init__(self, client: redis.Redis, layout: StateLayout) -> None:
        self.client = client
        self.layout = layout
        self._script = client.register_script(_RECORD)
        self._registry = GenerationRegistry(client, layout)  # knows each generation's shards

    def record_batch(
        self,
        generation: int,
        batch_id: int,
        events: int,
        duplicates: int,
        effects: int,
        dead_letters_by_reason: Mapping[str, int],
        duration_ms: float,
        watermark_ms: int | None,
        *,
        checkpoint_id: str = "",
        now_ms: int,
    ) -> bool:
        """Count one micro-batch, once (one Lua call; see the module docstring).

        Args:
            generation: The generation.
            batch_id: Spark's batch id.
            events: Records applied.
            duplicates: Records skipped as re-sent by their upstream.
            effects: Outputs produced.
            dead_letters_by_reason: Dead letters by reason.
            duration_ms: The batch's wall time on the driver.
            watermark_ms: The generation's watermark after the batch (None: none).
            checkpoint_id: The Spark checkpoint's query id ("" when unknown).
            now_ms: Epoch ms of the batch's end.

        Returns:
            False when this batch (or a later one of the checkpoint) was counted already.
        """
        pairs = batch_increments(events, duplicates, effects, dead_letters_by_reason, duration_ms)
        args: list[str | int] = [checkpoint_id, batch_id, now_ms, len(pairs)]
        for name, amount in pairs:
            args += [name, amount]
        if watermark_ms is not None:
            args += ["watermark_ms", watermark_ms]
        keys = [self.layout.generation(generation).stats]
        return int(cast("int", self._script(keys=keys, args=args))) == 1

    def _hashes(self, generation: int) -> list[str]:
        """The generation's stats hash, then each shard's.

        Sharded, the transactions count in their shards' hashes (their own slots); the
        driver's batch fields stay in the generation's.
        """
        keys = self._registry.keys(generation)
        return [keys.stats, *(k.stats for k in keys.each_shard() if k.shard is not None)]

    def read(self, generation: int) -> BatchStats:
        """One generation's stats (all zero when it has none)."""
        return self.read_many([generation])[generation]

    def read_many(self, generations: Iterable[int]) -> dict[int, BatchStats]:
        """Several generations' stats in one round trip (their shards' counts added up)."""
        wanted = [(g, self._hashes(g)) for g in generations]
        with self.client.pipeline(transaction=False) as pipe:
            for _generation, hashes in wanted:
                for key in hashes:
                    pipe.hgetall(key)
            raws = iter(cast("list[dict[bytes, bytes]]", pipe.execute()))
        found = {}
        for generation, hashes in wanted:
            raw = dict(next(raws))
            for shard_raw in (next(raws) for _ in hashes[1:]):
                for name, value in shard_raw.items():  # counters only: they add up
                    raw[name] = str(int(raw.get(name, 0)) + int(value)).encode()
            found[generation] = parse_stats(raw)
        return found

    def reset(self, generation: int) -> None:
        """Forget a generation's stats (its batch ids start again, e.g. an in-place reset)."""
        self.client.unlink(*self._hashes(generation))
