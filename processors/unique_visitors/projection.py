"""The unique_visitors fold: each page view counts its visitor, overall and for its device.

Pure (see :mod:`refold.processors.fold.windows`). Buckets are hours of event time; ``count`` is page
views, ``distinct:visitors`` the HyperLogLog estimate of distinct visitors.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from refold.contracts.processors import ProcessorOptions
from refold.processors.fold.windows import Measure, Tumbling

__all__ = ["ALL", "UniqueVisitors", "build"]

ALL = "all"  # the group of every page view (the others: one per device)
HOUR_MS = 3_600_000


class UniqueVisitors:
    """Distinct visitors per hour: overall (group ``all``) and per device."""

    name = "unique_visitors"
    event_types = ("PageViewed",)
    windows = (Tumbling("hourly", size_ms=HOUR_MS),)
    distinct = ("visitors",)

    def measure(self, event_type: str, event: Mapping[str, Any]) -> Iterable[Measure]:
        """The visitor, counted overall and for the device."""
        del event_type
        visitor = {"visitors": str(event["visitor_id"])}
        return [
            Measure(group=ALL, distinct=visitor),
            Measure(group=str(event["device"]).lower(), distinct=visitor),
        ]


def build(options: ProcessorOptions) -> UniqueVisitors:
    """The fold (the spec's ``projection`` factory); it has no options of its own."""
    del options
    return UniqueVisitors()
