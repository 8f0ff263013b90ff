"""The sales_windows fold: what one payment counts for (pure; see fold/windows.py).

Each ``OrderPaid`` counts in its currency's buckets with its amount (integer minor units: sum,
minimum, maximum and average) and its payment method (distinct methods, HyperLogLog).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from refold.contracts.processors import ProcessorOptions
from refold.processors.fold.windows import Hopping, Measure, Sliding, Tumbling

__all__ = ["SalesWindows", "build"]


class SalesWindows:
    """Sales per currency: per minute, five minutes hopping by one, five minutes sliding."""

    name = "sales_windows"
    event_types = ("OrderPaid",)
    windows = (
        Tumbling("per_minute", size_ms=60_000),
        Hopping("five_minutes_hopping", size_ms=300_000, hop_ms=60_000),
        # Read on demand (the last five minutes at any 10 s), not emitted every 10 s.
        Sliding("five_minutes_sliding", size_ms=300_000, step_ms=10_000, emit=False),
    )
    distinct = ("payment_methods",)

    def measure(self, event_type: str, event: Mapping[str, Any]) -> Iterable[Measure]:
        """One payment: its currency, its amount and its payment method."""
        del event_type
        return [
            Measure(
                group=str(event["currency"]),
                values={"amount_minor": int(event["amount_minor"])},
                distinct={"payment_methods": str(event["payment_method"])},
            )
        ]


def build(options: ProcessorOptions) -> SalesWindows:
    """The fold (the spec's ``projection`` factory); it has no options of its own."""
    del options
    return SalesWindows()
