"""De-duplication by event id (pure): the rule the writer and the oracle share."""

from __future__ import annotations

import pytest

from refold.contracts.errors import ContractError
from refold.contracts.processors import EventId
from refold.deploy.simulators.orders import OrderSimulator
from refold.processors.fold.dedupe import SeenIds
from refold.processors.fold.oracle import fold_all
from refold.processors.order_state.projection import OrderStateProjection


def test_an_entity_skips_an_id_it_applied_and_forgets_past_the_horizon() -> None:
    seen = SeenIds(EventId(horizon=2))
    seen.remember("o-1", {"event_id": "a"})
    assert seen.is_duplicate("o-1", {"event_id": "a"})
    assert not seen.is_duplicate("o-2", {"event_id": "a"})  # per entity
    assert not seen.is_duplicate("o-1", {"other": "a"})  # no id: never a duplicate
    seen.remember("o-1", {"event_id": "b"})
    seen.remember("o-1", {"event_id": "c"})  # "a" falls out of the horizon
    assert not seen.is_duplicate("o-1", {"event_id": "a"})
    assert seen.is_duplicate("o-1", {"event_id": "b"})
    assert seen.encoded() == {"o-1": b'["b","c"]'}


def test_stored_ids_load_back_as_they_were() -> None:
    seen = SeenIds.load(EventId(horizon=3), {"o-1": b'["x","y"]', "o-2": None})
    assert seen.is_duplicate("o-1", {"event_id": "y"})
    assert not seen.changed


def test_the_oracle_with_dedupe_equals_the_oracle_of_the_distinct_events() -> None:
    projection = OrderStateProjection()
    events = list(OrderSimulator(200, seed=4, anomaly_rate=0))
    # A retrying producer: every 7th event twice, some right away, some much later.
    doubled = [e for n, e in enumerate(events) for _ in range(2 if n % 7 == 0 else 1)]
    doubled += events[100:140]
    deduped = fold_all(projection, doubled, dedupe=EventId())
    distinct = fold_all(projection, events)
    assert deduped.states == distinct.states
    assert deduped.aggregate == distinct.aggregate
    assert deduped.duplicates == len(doubled) - len(events)
    assert fold_all(projection, doubled).states != distinct.states  # the premise


def test_a_spec_refuses_a_dedupe_without_field_or_horizon() -> None:
    with pytest.raises(ContractError, match="horizon >= 1"):
        EventId(horizon=0)
    with pytest.raises(ContractError, match="needs a field"):
        EventId(field="")
