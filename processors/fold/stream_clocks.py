"""Event time over a derived topic: a clock per upstream stream, markers, an idle timeout (pure).

A partition of a processor's output stream interleaves several upstream *streams* (one per
source partition, and writer slot, of the producing processor: the ``<stream>`` of their origin
ids, :mod:`refold.contracts.origin`). Each is in order on its own; their interleaving goes back
in event time by up to the upstream's micro-batch span. Judging lateness against the raw
partition, as :class:`~refold.processors.fold.eventtime.PartitionClocks` does for a source
topic, would need a lateness that covers that span (12 hours in the demo).

:class:`StreamClocks` keeps, per derived partition ``P``, a clock per stream (the hash field
``P|<stream>``), moved by the stream's records and by watermark markers
(:mod:`refold.contracts.watermarks`), which reach every partition, including those that receive
no record of the stream. A marker also says how many streams the producer has (``P|#``).

The partition's own clock ``P`` (what the watermark, timers and readers read) is the minimum
over its *live* streams, and never goes back; it is ``None`` until a marker has said how many
streams there are and each has a clock (one that starts later may bring any time, all on
time). A stream is idle,
and left out of that minimum, while its clock is more than ``idle_ms`` of event time behind the
partition's newest stream clock; a stream never heard of is idle once the newest is ``idle_ms``
past the first event time seen on the partition (``P|^``). So a quiet upstream partition holds
the watermark back by at most ``idle_ms`` of the others' event time. Every one of these is a
function of the partition's records in log order, so live processing and every replay decide
alike.

A record is late when its event time is more than the lateness behind the larger of its
stream's clock and the partition's clock: an on-time record is never below the partition's
watermark, even from a stream that was idle or is new on the partition.
"""

from __future__ import annotations

from collections.abc import Mapping

from refold.contracts.layout import parse_position_field, position_field
from refold.contracts.origin import parse_origin_id
from refold.contracts.processors import EventTime
from refold.contracts.watermarks import Marker
from refold.processors.fold.eventtime import PartitionClocks, Verdict

__all__ = ["StreamClocks", "TopicClocks", "stream_clock_field", "stream_of"]

_SEP = "|"
_COUNT, _FIRST = "#", "^"  # reserved stream names: a real one holds "|" and "/"


def stream_of(origin: str | None) -> str:
    """The stream of a record of a derived topic: its origin id's (``""``: it has none)."""
    parsed = parse_origin_id(origin)
    return "" if parsed is None else parsed.stream


def stream_clock_field(field: str, stream: str) -> str:
    """The clocks-hash field of ``stream``'s clock on partition ``field`` (``topic/partition``).

    The stream goes last: it holds ``|`` itself (``order_state|commerce.orders/3``).
    """
    return f"{field}{_SEP}{stream}"


class StreamClocks:
    """The per-stream clocks of the derived partitions of one transaction, in log order.

    Args:
        event_time: The processor's event-time settings (lateness, retention).
        stored: Clocks as stored: ``topic/partition`` (the partition clock) and
            ``topic/partition|<stream>`` (a stream's clock) -> event time (ms).
        idle_ms: A stream more than this behind the partition's newest stream clock is left
            out of the partition clock (``None``: never; a quiet stream holds it back).
    """

    def __init__(
        self, event_time: EventTime, stored: Mapping[str, int], idle_ms: int | None
    ) -> None:
        if idle_ms is not None and idle_ms < 0:
            msg = f"idle_ms must be >= 0 or None, not {idle_ms}"
            raise ValueError(msg)
        self.event_time = event_time
        self.idle_ms = idle_ms
        self.partition: dict[str, int] = {}
        self.streams: dict[str, dict[str, int]] = {}
        self.expected: dict[str, int] = {}
        self.first: dict[str, int] = {}
        for name, value in stored.items():
            field, sep, stream = name.partition(_SEP)
            if not sep:
                self.partition[field] = value
            elif stream == _COUNT:
                self.expected[field] = value
            elif stream == _FIRST:
                self.first[field] = value
            else:
                self.streams.setdefault(field, {})[stream] = value
        self.changed: dict[str, int] = {}

    def clock(self, field: str) -> int | None:
        """The partition's clock (``None`` until a record or a marker reached it)."""
        return self.partition.get(field)

    def observe(self, field: str, stream: str, at: int) -> Verdict:
        """Judge a record of ``stream`` on partition ``field`` at ``at``, then move the clocks."""
        own = self.streams.get(field, {}).get(stream)
        known = [c for c in (own, self.partition.get(field)) if c is not None]
        verdict = Verdict.ON_TIME
        if known:
            watermark = max(known) - self.event_time.lateness_ms
            if at < watermark:
                expired = at < watermark - self.event_time.retention_ms
                verdict = Verdict.EXPIRED if expired else Verdict.LATE
        self._advance(field, {stream: at})
        return verdict

    def mark(self, field: str, marker: Marker) -> None:
        """A watermark marker on partition ``field``: each stream has come to its time."""
        if marker.of > self.expected.get(field, 0):
            self.expected[field] = self.changed[stream_clock_field(field, _COUNT)] = marker.of
        self._advance(field, marker.at)

    def _advance(self, field: str, times: Mapping[str, int]) -> None:
        clocks = self.streams.setdefault(field, {})
        for stream, at in times.items():
            if stream not in clocks or at > clocks[stream]:
                clocks[stream] = self.changed[stream_clock_field(field, stream)] = at
        if field not in self.first:
            first = min(times.values())
            self.first[field] = self.changed[stream_clock_field(field, _FIRST)] = first
        newest = max(clocks.values())
        idle = self.idle_ms
        expected = self.expected.get(field)
        unheard = expected is None or expected > len(clocks)  # no marker yet: count unknown
        if unheard and (idle is None or newest - self.first[field] <= idle):
            return  # a stream not heard of yet may bring any time
        live = [c for c in clocks.values() if idle is None or c >= newest - idle]
        current = self.partition.get(field)
        low = min(live)
        if current is None or low > current:
            self.partition[field] = self.changed[field] = low


class TopicClocks:
    """The clocks of one transaction: per partition (source topics) or per stream (derived).

    One place for the choice, used by the writer (:mod:`refold.processors.runtime.lateness`)
    and the oracle alike: a partition of a topic in ``stream_topics`` (it carries markers) is
    judged by :class:`StreamClocks`, any other by
    :class:`~refold.processors.fold.eventtime.PartitionClocks`.

    Args:
        event_time: The processor's event-time settings (``idle_ms`` for the streams).
        stored: The clocks as stored: ``topic/partition`` and ``topic/partition|<stream>``.
        stream_topics: The topics that carry markers.
    """

    def __init__(
        self, event_time: EventTime, stored: Mapping[str, int], stream_topics: frozenset[str]
    ) -> None:
        self.stream_topics = stream_topics
        plain: dict[str, int] = {}
        derived: dict[str, int] = {}
        for name, value in stored.items():
            parsed = parse_position_field(name.partition(_SEP)[0])
            if parsed is not None and parsed[0] in stream_topics:
                derived[name] = value
            elif parsed is not None and _SEP not in name:
                plain[name] = value
        self.plain = PartitionClocks(event_time, plain)
        self.streams = StreamClocks(event_time, derived, event_time.idle_ms)

    def observe(self, topic: str, partition: int, stream: str, at: int) -> Verdict:
        """Judge a record at ``at`` (of ``stream``, on a derived topic), then move the clocks."""
        field = position_field(topic, partition)
        if topic in self.stream_topics:
            return self.streams.observe(field, stream, at)
        return self.plain.observe(field, at)

    def mark(self, topic: str, partition: int, marker: Marker) -> None:
        """A watermark marker on ``topic/partition`` (a topic that carries markers)."""
        self.streams.mark(position_field(topic, partition), marker)

    def clock(self, topic: str, partition: int) -> int | None:
        """The partition's clock (``None``: none yet)."""
        field = position_field(topic, partition)
        if topic in self.stream_topics:
            return self.streams.clock(field)
        return self.plain.clocks.get(field)

    @property
    def changed(self) -> dict[str, int]:
        """The clocks-hash fields that moved."""
        return {**self.plain.changed, **self.streams.changed}

    @property
    def clocks(self) -> dict[str, int]:
        """Every partition's clock (``topic/partition`` -> ms)."""
        return {**self.plain.clocks, **self.streams.partition}
