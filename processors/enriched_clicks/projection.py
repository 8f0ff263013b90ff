"""The enriched_clicks fold: a click counted with its customer's profile as of its time (pure).

See :mod:`refold.processors.fold.lookups`: the platform holds each click until customer_profiles'
watermark has passed it, then hands over the customer's row (the versions it keeps); the version
valid at the click's time gives the tier and country it is counted under. A click older than the
versions the table still keeps for its customer counts as ``expired``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from refold.contracts.processors import ProcessorOptions
from refold.processors.fold.lookups import EXPIRED, TableRef, as_of
from refold.processors.fold.projection import State

__all__ = ["EnrichedClicksProjection", "build"]


class EnrichedClicksProjection:
    """Clicks per customer tier and country, as the customer's profile was when they clicked."""

    name = "enriched_clicks"
    aggregate = "clicks_by_customer"
    event_types = ("SearchResultClicked",)
    lookup = TableRef("customer_profiles", "profiles")

    def lookup_key(self, event_type: str, event: Mapping[str, Any]) -> str | None:
        """The customer signed in, if any."""
        del event_type
        customer = event.get("customer_id")
        return None if customer is None else str(customer)

    def enrich(
        self, event_type: str, event: Mapping[str, Any], row: State | None, at: int
    ) -> Mapping[str, int]:
        """The click, under its customer's tier and country at ``at``."""
        del event_type
        if event.get("customer_id") is None:
            return {"clicks": 1, "anonymous": 1}
        profile = as_of(row, at)
        if profile is None:  # not registered (yet) at the click's time
            return {"clicks": 1, "unregistered": 1}
        if profile is EXPIRED:  # the table's retention dropped the version valid then
            return {"clicks": 1, "expired": 1}
        return {"clicks": 1, f"tier:{profile['tier']}": 1, f"country:{profile['country']}": 1}


def build(options: ProcessorOptions) -> EnrichedClicksProjection:
    """The fold (the spec's ``projection`` factory); it has no options of its own."""
    del options
    return EnrichedClicksProjection()
