"""The customer_profiles processor as the platform sees it (``refold.processors`` entry point).

A versioned table over ``crm.customers`` (keyed by ``customer_id``): each customer's profile
versions with the event time each became valid. Other processors read it as of their events'
time (enriched_clicks); its event time and watermark say when every version valid at a time is
in. Its options bound the versions kept per customer (``REFOLD_CUSTOMER_PROFILES__MAX_VERSIONS``,
``...__VERSION_HORIZON_MS``; see :class:`refold.processors.fold.lookups.VersionRetention`).
"""

from __future__ import annotations

from refold.contracts.processors import EventTime, ProcessorOptions, ProcessorSpec
from refold.contracts.web import CUSTOMERS
from refold.processors.customer_profiles.projection import DEFAULT_RETENTION

__all__ = ["CUSTOMER_PROFILES", "CustomerProfilesOptions"]


class CustomerProfilesOptions(ProcessorOptions):
    """customer_profiles' options: the common ones plus how many versions a customer keeps.

    Attributes:
        max_versions: The newest versions kept per customer.
        version_horizon_ms: Also drop a version superseded more than this long (event time)
            before the customer's newest one (``None``: no horizon).
    """

    max_versions: int = DEFAULT_RETENTION.max_versions
    version_horizon_ms: int | None = DEFAULT_RETENTION.horizon_ms


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
    options="refold.processors.customer_profiles.config:CustomerProfilesOptions",
    description="each customer's profile versions by event time (a versioned table)",
)
