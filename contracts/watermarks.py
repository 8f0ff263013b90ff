"""Watermark markers: how far each upstream stream of a derived topic has come (pure).

A processor's output stream (``order_state.changes``) interleaves, on each of its partitions,
the outputs of several *streams*: one per source partition the producing processor read (and
per writer slot, re-keyed), named as in their origin ids (:mod:`refold.contracts.origin`:
``<processor>[#<slot>]|<topic>/<partition>``). Each stream is in order on its own; their
interleaving is not (a micro-batch folds its source partitions in parallel tasks).

A *marker* is a record with no key and no value whose header ``refold.watermark`` says, per
stream, the largest event time (in the output stream's event-time field) among that stream's
outputs so far (``at``), and how many streams the producer has in all (``of``: its topics'
partitions, times its writer slots when re-keyed), so a consumer knows when it has heard of
every one. The producer writes one to every partition of the output topic, in the same
Kafka transaction as the outputs and after them, so a partition that received none of them
learns how far the streams came, and a consumer reading in log order knows, at each offset,
how far each stream is: the same at every replay. The rules that use markers are in
:mod:`refold.processors.fold.stream_clocks`; docs/event-time.md ("Across chains") explains them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import orjson

__all__ = ["WATERMARK", "Marker", "is_marker", "marker_headers", "read_marker"]

WATERMARK = "refold.watermark"

RecordHeaders = Sequence[tuple[str, str | bytes | None]]


@dataclass(frozen=True, slots=True)
class Marker:
    """What a marker says.

    Attributes:
        at: Stream -> the largest event time (ms) among its outputs so far.
        of: How many streams the producer has in all.
    """

    at: Mapping[str, int]
    of: int


def marker_headers(marker: Marker) -> list[tuple[str, bytes]]:
    """The headers of a marker: ``refold.watermark`` = ``{"at": {stream: ms}, "of": n}``.

    Raises:
        ValueError: Not a valid marker (:func:`_check`).
    """
    _check({"at": dict(marker.at), "of": marker.of})
    value = {"at": dict(sorted(marker.at.items())), "of": marker.of}
    return [(WATERMARK, orjson.dumps(value))]


def is_marker(headers: RecordHeaders | None) -> bool:
    """Whether a record with these headers is a watermark marker (not an event)."""
    return any(name == WATERMARK for name, _value in headers or ())


def read_marker(headers: RecordHeaders | None) -> Marker | None:
    """The marker these headers carry (``None``: not a marker).

    Raises:
        ValueError: The header is there but is not a marker's (a bad marker is not an event
            either: the caller dead-letters it).
    """
    for name, value in headers or ():
        if name != WATERMARK:
            continue
        raw = value.encode() if isinstance(value, str) else value
        try:
            parsed = orjson.loads(raw or b"")
        except orjson.JSONDecodeError as exc:
            msg = f"{WATERMARK} is not JSON: {exc}"
            raise ValueError(msg) from exc
        _check(parsed)
        parsed = cast("dict[str, Any]", parsed)
        return Marker({str(s): int(t) for s, t in parsed["at"].items()}, int(parsed["of"]))
    return None


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check(parsed: object) -> None:
    """A marker names at least one stream, each with an integer time, and ``of`` >= them."""
    ok = isinstance(parsed, dict) and set(parsed) == {"at", "of"}
    if ok:
        fields = cast("dict[str, Any]", parsed)
        at, of = fields["at"], fields["of"]
        ok = (
            isinstance(at, dict)
            and bool(at)
            and all(_is_int(t) for t in at.values())
            and _is_int(of)
            and of >= len(at)
        )
    if not ok:
        msg = f'{WATERMARK} is not {{"at": {{stream: ms, ...}}, "of": streams}}: {parsed!r}'
        raise ValueError(msg)
