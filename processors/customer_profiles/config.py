"""The customer_profiles processor as the platform sees it (``refold.processors`` entry point).

A versioned table over ``crm.customers`` (keyed by ``customer_id``): each customer's profile
versions with the event time each became valid. Other processors read it as of their events'
time (enriched_clicks); its event time and watermark say when every version valid at a time is
in.
"""

from __future__ import annotations

from refold.contracts.processors import EventTime, ProcessorSpec
from refold.contracts.web import CUSTOMERS

__all__ = ["CUSTOMER_PROFILES"]

CUSTOMER_PROFILES = ProcessorSpec(
    name="customer_profiles",
    projection="refold.processors.customer_profiles.projection:build",
    topics=(CUSTOMERS.name,),
    key="customer_id",
    tables=("profiles",),
    aggregates=("profile_totals",),
    # Account events come in event-time order per customer; a minute of lateness covers the
    # interleaving of customers on a partition.
    event_time=EventTime(
        field="changed_at",
        by_type=(("CustomerRegistered", "registered_at"),),
        lateness_ms=60_000,
    ),
    description="each customer's profile versions by event time (a versioned table)",
)
