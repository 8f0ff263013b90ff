"""Read event-time windows through the live-generation alias: results, ranges, distinct counts.

A window processor's buckets (see :mod:`refold.processors.fold.windows`) are read back here the way
the closer computes a window's result: a tumbling or hopping window is one bucket, a sliding window
is its fine buckets combined, and a distinct count is one PFCOUNT over the window's sketches
(several keys: the count of their union). So a reader sees, before a window closes, the result it
would emit now, and after, the result it emitted (or a corrected one, after late records). A
generation sharded by partition id keeps each partition id's share of every bucket and sketch in
its shard: a read combines the shards' buckets and counts the union of their sketches
(:class:`~refold.contracts.store.sketches.UnionCounts`); on a cluster the shards are in several
slots, so each is read as it is (no transaction spans them).

Like :class:`~refold.services.reader.state_reader.StateReader`, every call resolves the alias once
and reads that generation only: a replay's cutover switches readers between two calls, never within
one. Each call reads a bounded number of buckets (``max_buckets``); a wider request is refused with
a :class:`~refold.services.errors.WindowQueryError` rather than stalling Redis.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import redis

from refold.contracts.layout import DEFAULT_KEY_PREFIX, GenerationKeys, position_field
from refold.contracts.store.scan import scan_names
from refold.contracts.store.sketches import UnionCounts
from refold.contracts.windows import (
    Hopping,
    Sliding,
    Window,
    combine,
    result_of,
    scales_of,
    watermark_of,
)
from refold.services.errors import UnknownWindowError, WindowQueryError
from refold.services.reader.state_reader import StateReader, StateView

__all__ = ["MAX_BUCKETS", "Watermark", "WindowReader"]

MAX_BUCKETS = 10_000  # buckets (or sketches) one call reads at most


class WindowSource(Protocol):
    """What a reader needs of a window processor (its fold has these; so may anything else)."""

    @property
    def name(self) -> str: ...

    @property
    def windows(self) -> Sequence[Window]: ...

    @property
    def distinct(self) -> Sequence[str]: ...


@dataclass(frozen=True, slots=True)
class Watermark:
    """A processor's event-time progress, as its closer sees it.

    Attributes:
        watermark: The minimum over the partitions' clocks minus the allowed lateness: windows
            ending at or before it are closed. ``None`` before any event time was seen.
        lateness_ms: The allowed lateness it was computed with.
        clocks: Per partition (``<topic>/<partition>``): the largest event time seen on it (ms).
    """

    watermark: int | None
    lateness_ms: int
    clocks: dict[str, int]


def _hop(window: Window) -> int:
    """How far apart consecutive windows end (and consecutive buckets start)."""
    if isinstance(window, Hopping):
        return window.hop_ms
    if isinstance(window, Sliding):
        return window.step_ms
    return window.size_ms


def _ints(raw: Mapping[bytes, bytes]) -> dict[str, int]:
    return {k.decode(): int(v) for k, v in raw.items()}


class WindowReader:
    """Read-only access to one window processor's buckets.

    Args:
        client: redis-py client.
        processor: Processor name, e.g. ``sales_windows``.
        windows: The windows the processor declares (its fold's ``windows``).
        distinct: Its distinct measures (its fold's ``distinct``).
        key_prefix: Prefix of refold's keys.
        lateness_ms: The allowed lateness of its spec's ``event_time`` (for :meth:`watermark`).
        max_buckets: The most buckets (or sketches) one call reads; wider requests are refused.
        scales: Its decimal measures' scales (its fold's ``scales``): their aggregates are
            read as :class:`~decimal.Decimal` in the fold's units.
    """

    def __init__(
        self,
        client: redis.Redis,
        processor: str,
        windows: Sequence[Window],
        distinct: Sequence[str] = (),
        key_prefix: str = DEFAULT_KEY_PREFIX,
        *,
        lateness_ms: int = 0,
        max_buckets: int = MAX_BUCKETS,
        scales: Mapping[str, int] | None = None,
    ) -> None:
        self.client = client
        self.scales = dict(scales or {})
        self.processor = processor
        self.windows = {w.name: w for w in windows}
        self.distinct_measures = tuple(distinct)
        self.lateness_ms = lateness_ms
        self.max_buckets = max_buckets
        self._alias = StateReader(client, processor, key_prefix)
        self.registry = self._alias.registry

    @classmethod
    def from_fold(
        cls,
        client: redis.Redis,
        fold: WindowSource,
        key_prefix: str = DEFAULT_KEY_PREFIX,
        *,
        lateness_ms: int = 0,
        max_buckets: int = MAX_BUCKETS,
    ) -> WindowReader:
        """A reader of ``fold``'s windows, distinct measures and decimal measures."""
        return cls(
            client,
            fold.name,
            fold.windows,
            fold.distinct,
            key_prefix,
            lateness_ms=lateness_ms,
            max_buckets=max_buckets,
            scales=scales_of(fold),
        )

    def live_generation(self) -> int:
        """The generation readers see now.

        Raises:
            NoLiveGenerationError: The processor has not run yet.
        """
        return self._alias.live_generation()

    # -- reads ---------------------------------------------------------------------------

    def window(self, name: str, group: str, end: int, generation: int | None = None) -> StateView:
        """The result of the window ``name`` of ``group`` ending at ``end`` (epoch ms).

        ``value`` is the result as the closer emits it (see
        :func:`~refold.processors.fold.windows.result_of`): ``count``, ``sum:``, ``min:``, ``max:``,
        ``avg:`` and ``distinct:`` per measure; a window without data has only ``count`` 0.

        Raises:
            UnknownWindowError: The processor has no window ``name``.
            WindowQueryError: No window of ``name`` ends at ``end``.
        """
        window = self._window(name)
        if end % _hop(window):
            msg = (
                f"{self.processor} window {name!r} has no window ending at {end}: its windows "
                f"end every {_hop(window)} ms (e.g. at {end - end % _hop(window)})"
            )
            raise WindowQueryError(msg)
        gen = self._generation(generation)
        keys = self.registry.keys(gen)
        applied = self.registry.positions_of(gen)
        starts = window.bucket_starts(end)
        shards = keys.each_shard()
        union = self._union(keys, [(name, m, group, starts) for m in self.distinct_measures])
        with self.client.pipeline(transaction=self.registry.one_transaction(keys)) as pipe:
            for shard in shards:
                for start in starts:
                    pipe.hgetall(shard.window_bucket(name, start, group))
            counted = union.queue(pipe)
            applied.queue(pipe)
            replies = pipe.execute()
        read = len(shards) * len(starts)
        buckets = [_ints(r) for r in replies[:read]]
        counts = union.counts(replies[read : read + counted])
        distinct = dict(zip(self.distinct_measures, counts, strict=True))
        value = result_of(window, end, group, combine(buckets), distinct, self.scales)
        positions = applied.parse_replies(replies[read + counted :]).positions
        return StateView(gen, value, positions)

    def range(
        self, name: str, group: str, start: int, end: int, generation: int | None = None
    ) -> StateView:
        """Every window of ``name`` of ``group`` ending in ``(start, end]`` that has data.

        ``value`` is a list of results (as :meth:`window`), oldest first. For a sliding window,
        every step's window. The counts, sums and extremes are read in one transaction with the
        positions; the distinct counts of the windows with data right after.

        Raises:
            UnknownWindowError: The processor has no window ``name``.
            WindowQueryError: The range spans more than ``max_buckets`` buckets.
        """
        window = self._window(name)
        hop = _hop(window)
        ends = range(start - start % hop + hop, end + 1, hop)
        per_window = len(window.bucket_starts(hop))
        self._check_budget(name, len(ends) * per_window, f"({start}, {end}]")
        gen = self._generation(generation)
        keys = self.registry.keys(gen)
        applied = self.registry.positions_of(gen)
        if not ends:
            return StateView(gen, [], applied.read().positions)
        starts = sorted({s for e in ends for s in window.bucket_starts(e)})
        shards = keys.each_shard()
        with self.client.pipeline(transaction=self.registry.one_transaction(keys)) as pipe:
            for shard in shards:
                for s in starts:
                    pipe.hgetall(shard.window_bucket(name, s, group))
            applied.queue(pipe)
            replies = pipe.execute()
        read = len(shards) * len(starts)
        parts = [_ints(r) for r in replies[:read]]
        stored = {s: combine(parts[i :: len(starts)]) for i, s in enumerate(starts)}
        found = []
        for e in ends:
            aggregates = combine(stored[s] for s in window.bucket_starts(e))
            if aggregates.get("count", 0) > 0:
                found.append((e, aggregates))
        distinct = self._distinct_counts(keys, name, group, [e for e, _ in found])
        results = [
            result_of(window, e, group, aggregates, counts, self.scales)
            for (e, aggregates), counts in zip(found, distinct, strict=True)
        ]
        return StateView(gen, results, applied.parse_replies(replies[read:]).positions)

    def distinct(
        self,
        name: str,
        measure: str,
        group: str,
        start: int,
        end: int,
        generation: int | None = None,
    ) -> StateView:
        """Distinct ``measure`` values in the buckets of ``name`` starting in ``[start, end)``.

        One PFCOUNT of their sketches: the estimate of their union, e.g. a day's distinct
        visitors from its 24 hourly sketches. ``value`` is an int (0 without data). Hopping
        buckets overlap (the union still counts a value once), so the span covered runs to the
        last bucket's end.

        Raises:
            UnknownWindowError: The processor has no window ``name``.
            WindowQueryError: ``measure`` is not one of its distinct measures, or the range
                spans more than ``max_buckets`` buckets.
        """
        window = self._window(name)
        if measure not in self.distinct_measures:
            known = ", ".join(self.distinct_measures) or "none"
            msg = f"{self.processor} has no distinct measure {measure!r} (its measures: {known})"
            raise WindowQueryError(msg)
        hop = _hop(window)
        starts = range(start + (-start) % hop, end, hop)
        self._check_budget(name, len(starts), f"[{start}, {end})")
        gen = self._generation(generation)
        keys = self.registry.keys(gen)
        applied = self.registry.positions_of(gen)
        if not starts:
            return StateView(gen, 0, applied.read().positions)
        union = self._union(keys, [(name, measure, group, starts)])
        with self.client.pipeline(transaction=self.registry.one_transaction(keys)) as pipe:
            counted = union.queue(pipe)
            applied.queue(pipe)
            replies = pipe.execute()
        (count,) = union.counts(replies[:counted])
        return StateView(gen, count, applied.parse_replies(replies[counted:]).positions)

    def groups(self, name: str, generation: int | None = None) -> StateView:
        """The groups that have buckets of window ``name`` (``value``: sorted list)."""
        self._window(name)
        gen = self._generation(generation)
        keys = self.registry.keys(gen)
        applied = self.registry.positions_of(gen)
        found = {group for _start, group in self._buckets(keys, name)}
        return StateView(gen, sorted(found), applied.read().positions)

    def watermark(self, generation: int | None = None) -> StateView:
        """The processor's watermark and its partitions' clocks (``value``: :class:`Watermark`)."""
        gen = self._generation(generation)
        keys = self.registry.keys(gen)
        applied = self.registry.positions_of(gen)
        shards = keys.each_shard()  # sharded: each partition's clock is in its shard's hash
        with self.client.pipeline(transaction=self.registry.one_transaction(keys)) as pipe:
            for shard in shards:
                pipe.hgetall(shard.clocks)
            applied.queue(pipe)
            replies = pipe.execute()
        # Not the writer slots' own copies (``s<slot>|<topic>/<p>``, re-keyed processors):
        # the generation's clock of a partition is their minimum.
        clocks = {
            f: t for raw in replies[: len(shards)] for f, t in _ints(raw).items() if "|" not in f
        }
        positions = applied.parse_replies(replies[len(shards) :]).positions
        every = [position_field(t, p) for t, p in positions]
        value = Watermark(watermark_of(clocks, self.lateness_ms, every), self.lateness_ms, clocks)
        return StateView(gen, value, positions)

    def freshness(self, generation: int | None = None) -> dict[tuple[str, int], int]:
        """Applied positions of the (live) generation."""
        return self._alias.freshness(generation)

    # -- helpers -------------------------------------------------------------------------

    def _generation(self, generation: int | None) -> int:
        return self.live_generation() if generation is None else generation

    def _window(self, name: str) -> Window:
        window = self.windows.get(name)
        if window is None:
            known = ", ".join(sorted(self.windows)) or "none"
            msg = (
                f"{self.processor} has no window {name!r} (its windows: {known}). Operator "
                "action: use one of those names; `refold processors` lists each processor's "
                "windows."
            )
            raise UnknownWindowError(msg)
        return window

    def _check_budget(self, name: str, buckets: int, span: str) -> None:
        if buckets > self.max_buckets:
            msg = (
                f"{self.processor} window {name!r} over {span} reads {buckets} buckets, more "
                f"than {self.max_buckets} at once. Operator action: ask for a narrower range "
                "(several calls), or raise max_buckets."
            )
            raise WindowQueryError(msg)

    def _distinct_counts(
        self, keys: GenerationKeys, name: str, group: str, ends: Sequence[int]
    ) -> list[dict[str, int]]:
        """Per window end: the distinct counts of every measure (one PFCOUNT each)."""
        if not self.distinct_measures or not ends:
            return [{} for _ in ends]
        window = self.windows[name]
        sketches = [
            (name, measure, group, window.bucket_starts(e))
            for e in ends
            for measure in self.distinct_measures
        ]
        union = self._union(keys, sketches)
        with self.client.pipeline(transaction=self.registry.one_transaction(keys)) as pipe:
            union.queue(pipe)
            counts = union.counts(pipe.execute())
        n = len(self.distinct_measures)
        return [
            dict(zip(self.distinct_measures, counts[i * n : (i + 1) * n], strict=True))
            for i in range(len(ends))
        ]

    def _buckets(self, keys: GenerationKeys, name: str) -> Iterator[tuple[int, str]]:
        """``(start, group)`` of every bucket of window ``name`` (SCAN, in no order).

        Sharded, of every shard (a bucket several partition ids added to: once per shard).
        """
        for shard in keys.each_shard():
            for key in scan_names(self.client, shard.window_pattern(name)):
                parsed = shard.parse_window_bucket(key)
                if parsed is not None and parsed[0] == name:
                    yield parsed[1], parsed[2]

    def _union(
        self, keys: GenerationKeys, sketches: Sequence[tuple[str, str, str, Sequence[int]]]
    ) -> UnionCounts:
        """The distinct counts of ``(window, measure, group, bucket starts)`` each.

        Each is the count of the union of its buckets' sketches, every shard's (sharded: each
        partition id keeps its own), merged where a cluster keeps them in several slots.
        """
        shards = keys.each_shard()
        groups = [
            [shard.window_distinct(name, measure, s, group) for s in starts for shard in shards]
            for name, measure, group, starts in sketches
        ]
        return UnionCounts(self.client, groups, keys.scratch("pf"))
