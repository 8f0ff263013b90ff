"""Window buckets in Redis: the writes of one transaction, and the closer that emits results.

A transaction's window writes are :func:`~refold.processors.runtime.window_writes.write_windows`.

:class:`WindowCloser` runs on the driver after each micro-batch (one per processor query, so one
at a time): it fires the close timers the processor's watermark has passed, emitting each
window's result to ``<processor>.windows`` (a ``WindowResult`` record, Avro), and deletes the
buckets whose retention is over. A result is produced and acknowledged before its timer is
removed: at least once (a crash in between emits it again, with the same origin id: read the
results as upserts by window, start and group). A late record that ``accept`` folds into a
closed window sets its timer again, and the window is emitted again with the corrected result.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping, Sequence
from typing import Any, cast

import redis
from confluent_kafka import Producer

from refold.contracts.kafka.outputs import Deliveries, output_producer
from refold.contracts.layout import (
    GenerationKeys,
    StateLayout,
    position_field,
)
from refold.contracts.origin import ORIGIN_ID, sender_headers
from refold.contracts.store.connect import redis_client
from refold.contracts.store.generations import GenerationRegistry, status_and_live
from refold.contracts.store.positions import GenerationPositions
from refold.contracts.store.sketches import UnionCounts
from refold.contracts.windows import WINDOW_RESULT, result_record, watermark_of
from refold.processors.fold.projection import output_codec, output_framing
from refold.processors.fold.windows import (
    CLOSE_TIMERS,
    EXPIRE_TIMERS,
    WindowFold,
    combine,
    decode_timer,
    scales_of,
    windows_topic,
)
from refold.processors.runtime.background import DriverTask
from refold.processors.runtime.window_results import window_results

__all__ = [
    "WindowCloser",
    "generation_watermark",
]

logger = logging.getLogger(__name__)

# KEYS[1]: the close timers; KEYS[2..]: buckets. ARGV: n, the n buckets' counts as read, then
# per timer: member, k, and its k bucket indices (into KEYS). A timer is removed when none of
# its buckets' counts moved since the read.
_SETTLE = """
local n = tonumber(ARGV[1])
local moved = {}
for i = 1, n do
  local now = tonumber(redis.call('HGET', KEYS[i + 1], 'count') or '0')
  moved[i + 1] = now ~= tonumber(ARGV[i + 1])
end
local i, removed = n + 2, 0
while i <= #ARGV do
  local member, k = ARGV[i], tonumber(ARGV[i + 1])
  local keep = false
  for j = 1, k do
    if moved[tonumber(ARGV[i + 1 + j])] then keep = true end
  end
  if not keep then removed = removed + redis.call('ZREM', KEYS[1], member) end
  i = i + 2 + k
end
return removed
"""
_DUE_CHUNK = 2_000  # timers fired per round (per shard: each shard holds its own)
_Due = tuple[str, int, str]  # (window, end or start, group)
_Buckets = dict[tuple[str, int, str], dict[str, int]]


def generation_watermark(client: redis.Redis, keys: GenerationKeys, lateness_ms: int) -> int | None:
    """A generation's watermark over all of its partitions (``None`` until each has a clock).

    Each shard's clocks are read with its positions (one transaction per shard, sharded).
    """
    clocks: dict[str, int] = {}
    partitions: list[str] = []
    for shard in keys.each_shard():
        with client.pipeline(transaction=True) as pipe:
            pipe.hgetall(shard.clocks)
            GenerationPositions(client, shard).queue(pipe)
            raw_clocks, raw_positions = pipe.execute()
        clocks.update(
            (k.decode(), int(v)) for k, v in cast("dict[bytes, bytes]", raw_clocks).items()
        )
        applied = GenerationPositions.parse(raw_positions).positions
        partitions += [position_field(t, p) for t, p in applied]
    return watermark_of(clocks, lateness_ms, partitions)


class WindowCloser(DriverTask):
    """Emits the results of the windows the watermark has passed; expires old buckets.

    Driver side, one per processor query. Picklable before first use (clients are lazy).

    Args:
        layout: The processor's keys.
        generation: The generation it closes windows of.
        fold: The window processor.
        lateness_ms: The allowed lateness (the watermark is the clocks' minimum minus it).
        redis_url: Redis.
        kafka: librdkafka settings of the producer.
        topic: Where results go; default ``<processor>.windows``.
    """

    def __init__(
        self,
        layout: StateLayout,
        generation: int,
        fold: WindowFold,
        lateness_ms: int,
        redis_url: str,
        kafka: Mapping[str, str],
        topic: str | None = None,
    ) -> None:
        super().__init__()
        self.layout = layout
        self.generation = generation
        self.fold = fold
        self.lateness_ms = lateness_ms
        self.redis_url = redis_url
        self.kafka = dict(kafka)
        self.topic = topic or windows_topic(layout.processor)
        self._windows = {w.name: w for w in fold.windows}
        self._scales = scales_of(fold)
        self._redis: redis.Redis | None = None
        self._registry: GenerationRegistry | None = None
        self._producer: Producer | None = None
        self.suppressed = 0
        self.label = f"window closer of {layout.processor}"

    def run(self) -> int:
        """One round of the background task: :meth:`close`."""
        return self.close()

    @property
    def redis(self) -> redis.Redis:
        """The Redis client (created on first use)."""
        if self._redis is None:
            self._redis = redis_client(self.redis_url)
        return self._redis

    @property
    def registry(self) -> GenerationRegistry:
        """The processor's generation registry (created on first use)."""
        if self._registry is None:
            self._registry = GenerationRegistry(self.redis, self.layout)
        return self._registry

    @property
    def keys(self) -> GenerationKeys:
        """The generation's keys, sharded as its registry records (each shard its own timers)."""
        return self.registry.keys(self.generation)

    def watermark(self) -> int | None:
        """The processor's watermark: its partitions' clocks' minimum minus the lateness."""
        return generation_watermark(self.redis, self.keys, self.lateness_ms)

    def close(self) -> int:
        """Fire every close timer at or below the watermark, then expire; returns emitted."""
        watermark = self.watermark()
        if watermark is None:
            return 0
        emitted = 0
        suppress = self._suppression()
        while True:
            fired = self._close_some(watermark, suppress)
            if fired is None:
                break
            emitted += fired
        self._expire(watermark)
        return emitted

    def _suppression(self) -> tuple[int, GenerationKeys] | None:
        """What not to emit again: a watermark, and the generation whose timers tell.

        Windows up to the other generation's watermark, except those whose close timer it still
        holds (it has not emitted them). While this generation is being built, the other is the
        live one: it closes its windows itself, unless its processor died before it did and is
        not started again before the flip (a crash, then a replay), and a window it still held
        would then be emitted by nobody. After the flip, it is the generation this one replaced;
        its closer may have been ahead of this one's at the flip. A window the other is about to
        close may be emitted by both (at least once, with the same origin id).
        """
        status, live = status_and_live(self.redis, self.layout, self.generation)
        if status == "building":
            other = live
        else:
            raw = cast("bytes | None", self.redis.hget(self.keys.meta, "replay_of"))
            other = int(raw) if raw else None
            if other is not None and self.registry.status(other) is None:  # gone (gc)
                other = None
        if other is None or other == self.generation:
            return None
        keys = self.registry.keys(other)
        watermark = generation_watermark(self.redis, keys, self.lateness_ms)
        return None if watermark is None else (watermark, keys)

    def _close_some(
        self, watermark: int, suppress: tuple[int, GenerationKeys] | None
    ) -> int | None:
        """One chunk of due timers: read, emit, settle (None: nothing was due).

        The buckets are read in one pipeline and the results emitted (acknowledged) before the
        timers are settled: at least once. A timer is settled only if none of its buckets'
        counts moved since they were read (one Lua call): a late record that ``accept`` folded
        into a window meanwhile leaves its timer, which fires again with the correction.

        Sharded, each shard holds a close timer for each window its partition id added to: the
        due timers of every shard are grouped by window, each window is read from every shard
        and emitted once, and then every shard's timer of it is settled.
        """
        keys = self.keys
        with self.redis.pipeline(transaction=False) as pipe:
            for shard in keys.each_shard():
                pipe.zrangebyscore(
                    shard.timers(CLOSE_TIMERS), "-inf", watermark, start=0, num=_DUE_CHUNK
                )
            fetched = cast("list[list[bytes]]", pipe.execute())
        due = list(dict.fromkeys(m for members in fetched for m in members))
        if not due:
            return None
        windows = [decode_timer(m) for m in due]
        buckets, distinct, read = self._read(windows)
        results = self._results(windows, buckets, distinct)
        send = results if suppress is None else self._not_emitted(results, due, windows, suppress)
        self.suppressed += len(results) - len(send)
        if send:
            self._emit(send)
        self._settle(due, windows, read)
        self.done += len(send)
        return len(send)

    def _not_emitted(
        self,
        results: list[dict[str, Any]],
        due: list[bytes],
        windows: list[tuple[str, int, str]],
        suppress: tuple[int, GenerationKeys],
    ) -> list[dict[str, Any]]:
        """The results another generation has not emitted (see :meth:`_suppression`).

        It has not emitted a window while any of its shards holds the window's close timer.
        """
        until, other = suppress
        pending: set[tuple[str, int, str]] = set()
        candidates = [(m, w) for m, w in zip(due, windows, strict=True) if w[1] <= until]
        if candidates:
            members: list[Any] = [m for m, _w in candidates]  # bytes, as stored
            with self.redis.pipeline(transaction=False) as pipe:
                for shard in other.each_shard():
                    pipe.zmscore(shard.timers(CLOSE_TIMERS), members)
                held = cast("list[list[float | None]]", pipe.execute())
            for scores in held:
                held_here = zip(candidates, scores, strict=True)
                pending |= {w for (_m, w), score in held_here if score is not None}
        return [
            r for r in results if r["end"] > until or (r["window"], r["end"], r["group"]) in pending
        ]

    def _read(
        self, windows: Sequence[tuple[str, int, str]]
    ) -> tuple[_Buckets, _Buckets, list[_Buckets]]:
        """Every bucket of the due windows (merged over the shards), and their distinct counts.

        Returns:
            The buckets, each the combination of every shard's share (``combine``); per due
            window its distinct counts (of the union of every shard's sketches of its
            buckets); and each shard's buckets as read (:meth:`_settle` compares their counts).
            One round trip (two on a cluster with shards: the sketches are merged apart).
        """
        keys = self.keys
        shards = keys.each_shard()
        wanted: dict[tuple[str, int, str], None] = {}
        for name, end, group in windows:
            window = self._windows.get(name)
            if window is not None:
                for start in window.bucket_starts(end):
                    wanted[(name, start, group)] = None
        buckets = list(wanted)
        counted = [(w, m) for w in windows if w[0] in self._windows for m in self.fold.distinct]
        union = UnionCounts(
            self.redis,
            [
                [
                    shard.window_distinct(name, measure, start, group)
                    for start in self._windows[name].bucket_starts(end)
                    for shard in shards
                ]
                for (name, end, group), measure in counted
            ],
            keys.scratch("pf"),
        )
        with self.redis.pipeline(transaction=False) as pipe:
            for shard in shards:
                for bucket in buckets:
                    pipe.hgetall(shard.window_bucket(*bucket))
            union.queue(pipe)
            replies = pipe.execute()
        read: list[_Buckets] = []
        for i in range(len(shards)):
            part = replies[i * len(buckets) : (i + 1) * len(buckets)]
            read.append(
                {
                    b: {k.decode(): int(v) for k, v in cast("dict[bytes, bytes]", r).items()}
                    for b, r in zip(buckets, part, strict=True)
                }
            )
        stored = {b: combine(shard[b] for shard in read) for b in buckets}
        distinct: _Buckets = {}
        counts = union.counts(replies[len(shards) * len(buckets) :])
        for (due, measure), count in zip(counted, counts, strict=True):
            distinct.setdefault(due, {})[measure] = count
        return stored, distinct, read

    def _results(
        self,
        windows: Sequence[tuple[str, int, str]],
        stored: Mapping[tuple[str, int, str], Mapping[str, int]],
        distinct: Mapping[tuple[str, int, str], Mapping[str, int]],
    ) -> list[dict[str, Any]]:
        """The results of the due windows (:func:`window_results`)."""
        return window_results(self._windows, self._scales, windows, stored, distinct)

    def _settle(
        self,
        due: Sequence[bytes],
        windows: Sequence[tuple[str, int, str]],
        read: Sequence[Mapping[tuple[str, int, str], Mapping[str, int]]],
    ) -> None:
        """Remove the fired timers whose buckets did not change since they were read.

        Per shard (``read``: each shard's buckets as :meth:`_read` read them), one script in
        the shard's slot: its timer of a window goes unless its own share of a bucket moved.
        """
        for shard, stored in zip(self.keys.each_shard(), read, strict=True):
            index: dict[tuple[str, int, str], int] = {}
            argv: list[bytes | str | int] = []
            members: list[bytes | str | int] = []
            for member, (name, end, group) in zip(due, windows, strict=True):
                window = self._windows.get(name)
                starts = window.bucket_starts(end) if window is not None else []
                positions = []
                for start in starts:
                    bucket = (name, start, group)
                    if bucket not in index:
                        index[bucket] = len(index) + 2  # KEYS[1] is the timers
                        argv.append(stored.get(bucket, {}).get("count", 0))
                    positions.append(index[bucket])
                members += [member, len(positions), *positions]
            keys = [shard.timers(CLOSE_TIMERS), *(shard.window_bucket(*b) for b in index)]
            self.redis.eval(_SETTLE, len(keys), *keys, len(index), *argv, *members)

    def _emit(self, results: Sequence[Mapping[str, Any]]) -> None:
        """Produce the results and wait for every acknowledgement (their timers stay if not)."""
        if self._producer is None:
            self._producer = output_producer(self.kafka)
        sent = Deliveries(self._producer, f"{len(results)} window results to {self.topic}")
        codec, framing = output_codec(), output_framing(self.topic)
        for result in results:
            record = result_record(self.keys.processor, result, self._scales)
            payload = codec.encode(WINDOW_RESULT, record, validated=True, framing=framing)
            # The same result emitted again has the same id; a correction has another.
            digest = hashlib.blake2b(payload, digest_size=8).hexdigest()
            result_id = (
                f"{self.keys.processor}|{result['window']}/{result['start']}/{digest}"
                f"/{result['group']}"
            )
            sent.produce(
                self.topic,
                payload,
                str(result["group"]).encode(),
                [
                    *sender_headers(self.keys.processor, self.keys.generation),
                    ("refold.window", str(result["window"]).encode()),
                    ("refold.window.end", str(result["end"]).encode()),
                    (ORIGIN_ID, result_id.encode()),
                ],
            )
        sent.wait()

    def _expire(self, watermark: int) -> None:
        """Delete the buckets (and sketches) whose retention the watermark has passed.

        Sharded, each shard's, with its own expiry timers (one transaction in its slot).
        """
        for shard in self.keys.each_shard():
            timers = shard.timers(EXPIRE_TIMERS)
            while True:
                due = cast(
                    "list[bytes]",
                    self.redis.zrangebyscore(timers, "-inf", watermark, start=0, num=_DUE_CHUNK),
                )
                if not due:
                    break
                doomed: list[str] = []
                for member in due:
                    name, start, group = decode_timer(member)
                    doomed.append(shard.window_bucket(name, start, group))
                    doomed += [
                        shard.window_distinct(name, m, start, group) for m in self.fold.distinct
                    ]
                with self.redis.pipeline(transaction=True) as pipe:
                    pipe.delete(*doomed)
                    pipe.zrem(timers, *due)
                    pipe.execute()
