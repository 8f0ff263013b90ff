"""Event time on re-keyed processors: what the start-up check accepts, and the oracle's rule
(lateness per source partition over every record that resolves, whichever entity it is of)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import pytest

from refold.contracts.processors import EventTime
from refold.processors.customer_stats.projection import CustomerStatsProjection
from refold.processors.enriched_clicks.projection import EnrichedClicksProjection
from refold.processors.errors import ProcessorConfigError
from refold.processors.fold.oracle import fold_timed, fold_windows
from refold.processors.fold.rekey import Keying, KeyResolver
from refold.processors.fold.windows import Measure, Tumbling
from refold.processors.runtime import run_checks
from refold.processors.sales_windows.projection import SalesWindows
from refold.processors.web_sessions.projection import WebSessionsProjection

REKEYED = Keying(3, "customer_id", ("order_id",), (("orders", "order_id"),), "re-keyed")
EVENT_TIME = EventTime(field="paid_at", lateness_ms=1_000)


class PerCustomer:
    name = "per_customer"
    event_types = ("OrderPaid",)
    windows = (Tumbling("minute", size_ms=60_000),)
    distinct = ()

    def measure(self, event_type: str, event: Mapping[str, Any]) -> Iterable[Measure]:
        del event_type
        return [Measure(str(event["customer_id"]), {"amount": int(event["amount"])})]


def test_a_re_keyed_window_or_entity_fold_accepts_an_event_time():
    run_checks.check_event_time(SalesWindows(), EVENT_TIME, REKEYED)
    run_checks.check_event_time(CustomerStatsProjection(), EVENT_TIME, REKEYED)


def test_timers_on_a_re_keyed_processor_are_accepted_and_lookups_refused():
    run_checks.check_event_time(WebSessionsProjection(), EVENT_TIME, REKEYED)
    run_checks.check_event_time(WebSessionsProjection(), EVENT_TIME, None)  # co-partitioned
    with pytest.raises(ProcessorConfigError, match=r"lookup .* re-keyed .* Operator action"):
        run_checks.check_event_time(EnrichedClicksProjection(), EVENT_TIME, REKEYED)
    run_checks.check_event_time(EnrichedClicksProjection(), EVENT_TIME, None)


def _placed(order: str, customer: str) -> tuple[str, dict]:
    return "OrderPlaced", {"order_id": order, "customer_id": customer}


def _paid(order: str, at: int, amount: int = 1) -> tuple[str, dict]:
    return "OrderPaid", {"order_id": order, "paid_at": at, "amount": amount}


def test_the_oracle_judges_lateness_per_partition_over_every_customer():
    """Partition 0 holds orders of two customers: b's payment is late because of a's, which
    came before it on the partition; the link fills in the customer; an order never placed is
    key-missing and moves no clock."""
    log = [
        ("orders/0", 0, *_placed("o1", "a")),
        ("orders/0", 1, *_placed("o2", "b")),
        ("orders/0", 2, *_paid("o1", 10_000, 5)),
        ("orders/0", 3, *_paid("ox", 50_000)),  # never placed: no customer, no clock
        ("orders/0", 4, *_paid("o2", 8_000, 7)),  # 2 s behind a's payment: late
        ("orders/0", 5, *_paid("o2", 9_500, 3)),  # within the lateness: on time
    ]
    oracle = fold_windows(PerCustomer(), EVENT_TIME, log, KeyResolver("customer_id", ("order_id",)))
    assert oracle.late == [("orders/0", 4)]
    assert oracle.key_missing == [("orders/0", 3)]
    assert oracle.clocks == {"orders/0": 10_000}
    assert oracle.buckets == {
        ("minute", 0, "a"): {"count": 1, "sum:amount": 5, "min:amount": 5, "max:amount": 5},
        ("minute", 0, "b"): {"count": 1, "sum:amount": 3, "min:amount": 3, "max:amount": 3},
    }


def test_the_timed_oracle_asks_for_the_partitions_when_re_keyed_with_timers():
    with pytest.raises(ValueError, match="every topic/partition"):
        fold_timed(WebSessionsProjection(), EVENT_TIME, ("t",), [], KeyResolver("customer_id", ()))
