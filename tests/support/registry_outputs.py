"""order_state's change stream written in registry framing, for the tests of its readers.

A contract set declares a new topic registry-framed; order_state's FoldWriter (the envelope
Spark's tasks run, in-process) folds simulated orders and writes its status changes there,
encoded as the registry says (``00`` + schema id). The caller has ``REFOLD_SCHEMA_REGISTRY__URL``
set and the contracts published.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from refold.contracts.codec import EventCodec
from refold.contracts.commerce import COMMERCE
from refold.contracts.registry import ContractSet, Registry, default_registry
from refold.contracts.schema_registry import SchemaRegistrySettings
from refold.contracts.topics import TopicSpec
from refold.deploy.simulators.orders import OrderSimulator
from refold.processors.fold import projection as projection_module
from refold.processors.fold.records import SourceRecord
from refold.processors.order_state.projection import OrderStateProjection
from refold.processors.runtime.envelope import FoldTarget, FoldWriter

__all__ = ["registry_framed_changes"]

_SDK = EventCodec(registry=SchemaRegistrySettings())  # single-object: what refold's SDK writes


def registry_framed_changes(
    target: FoldTarget,
    make_topic: Callable[..., str],
    monkeypatch: pytest.MonkeyPatch,
    *,
    orders: int,
    seed: int,
) -> tuple[str, list[tuple[str, dict[str, Any]]]]:
    """Fold ``orders`` simulated orders; returns the registry-framed change topic and the events."""
    changes = make_topic(partitions=3, prefix="changes")
    notices = make_topic(partitions=1, prefix="notices")
    declared = ContractSet(
        "moved",
        COMMERCE.schemas,
        (TopicSpec(changes, 3, "customer_id", ("OrderStatusChanged",), framing="registry"),),
    )
    registry = Registry([], [*default_registry().contract_sets.values(), declared])
    monkeypatch.setattr(projection_module, "default_registry", lambda: registry)
    projection_module.output_codec.cache_clear()  # built again, with REFOLD_SCHEMA_REGISTRY__URL
    events = list(OrderSimulator(orders, seed=seed))
    try:
        records = [
            SourceRecord(
                "orders", 0, offset, event["order_id"].encode(), _SDK.encode(event_type, event)
            )
            for offset, (event_type, event) in enumerate(events)
        ]
        projection = OrderStateProjection(notifications_topic=notices, changes_topic=changes)
        FoldWriter(target, projection).apply(records, batch_id=0)
    finally:
        projection_module.output_codec.cache_clear()
    return changes, events
