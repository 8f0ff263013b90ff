"""The archive of the reference topics: its event types and the field that dates each one.

Every event type is dated by its own event time (UTC): order events by the time of what
happened to the order, clickstream events by ``occurred_at``, account events by when they were
registered or changed. A type without its field would be dated by its Kafka timestamp.
"""

from __future__ import annotations

from refold.contracts.commerce import ORDERS
from refold.contracts.processors import EventTime
from refold.contracts.web import CUSTOMERS, PAGEVIEWS, SEARCHES
from refold.processors.archive.config import ArchiveOptions
from refold.processors.fold.archive import ArchiveProcessor

__all__ = ["DATES", "build"]

DATES = EventTime(
    field="occurred_at",
    by_type=(
        ("OrderPlaced", "placed_at"),
        ("OrderLineAdded", "added_at"),
        ("OrderLineRemoved", "removed_at"),
        ("OrderPaid", "paid_at"),
        ("OrderShipped", "shipped_at"),
        ("OrderCancelled", "cancelled_at"),
        ("CustomerRegistered", "registered_at"),
        ("ProfileChanged", "changed_at"),
    ),
)


def build(options: ArchiveOptions) -> ArchiveProcessor:
    """The archive processor (the spec's ``projection`` factory)."""
    types = (
        *ORDERS.event_types,
        *PAGEVIEWS.event_types,
        *SEARCHES.event_types,
        *CUSTOMERS.event_types,
    )
    return ArchiveProcessor(
        name="archive",
        root=options.root,
        event_types=tuple(dict.fromkeys(types)),
        dates=DATES,
        compression=options.compression,
        fsync=options.fsync,
    )
