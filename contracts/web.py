"""refold's web domain: the shop's clickstream and its customer accounts.

Registered like any user's contracts, through the ``refold.contracts`` entry point. Three topics:

- ``web.pageviews`` (``PageViewed``) and ``web.searches`` (``SearchPerformed``,
  ``SearchResultClicked``), both keyed by ``session_id`` with the same partition count, so
  they are co-partitioned: a processor joining searches, clicks and page views of one session
  finds them on the same partition number of each topic;
- ``crm.customers`` (``CustomerRegistered``, ``ProfileChanged``), keyed by ``customer_id``,
  the id orders on ``commerce.orders`` carry too (enrichment joins on it).

Clickstream events carry ``visitor_id`` (the cookie, for unique visitors), ``customer_id`` (null
when anonymous) and their event time ``occurred_at``; a click names its search by ``search_id``.
"""

from __future__ import annotations

from refold.contracts.catalog import SCHEMA_ROOT
from refold.contracts.registry import ContractSet
from refold.contracts.topics import TopicSpec

__all__ = ["CUSTOMERS", "PAGEVIEWS", "SEARCHES", "WEB"]

# 8 partitions on both clickstream topics: the highest-volume events, and the same count on
# both keeps them co-partitioned by session_id (changing one means changing both).
_SESSION_PARTITIONS = 8

PAGEVIEWS = TopicSpec(
    name="web.pageviews",
    partitions=_SESSION_PARTITIONS,
    key_field="session_id",
    event_types=("PageViewed",),
)

SEARCHES = TopicSpec(
    name="web.searches",
    partitions=_SESSION_PARTITIONS,
    key_field="session_id",
    event_types=("SearchPerformed", "SearchResultClicked"),
)

# 4 partitions: account events are a small stream (registrations and profile edits).
CUSTOMERS = TopicSpec(
    name="crm.customers",
    partitions=4,
    key_field="customer_id",
    event_types=("CustomerRegistered", "ProfileChanged"),
)

WEB = ContractSet(name="web", schemas=SCHEMA_ROOT / "web", topics=(PAGEVIEWS, SEARCHES, CUSTOMERS))
