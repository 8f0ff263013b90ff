"""The processor catalogue: what replay and the CLI may know about a processor without importing it.

Replay starts processors as processes (``python -m <module>``), so this is the whole contract.
"""

from __future__ import annotations

from dataclasses import dataclass

from contracts.topics import ORDERS

__all__ = ["PROCESSORS", "ProcessorSpec", "consumer_group", "processor_spec"]


def consumer_group(processor: str, generation: int) -> str:
    """The Kafka consumer group that mirrors a generation's progress (for lag tooling)."""
    return f"refold.{processor}.g{generation}"


@dataclass(frozen=True, slots=True)
class ProcessorSpec:
    """A processor as seen from outside.

    Attributes:
        name: Processor name (Redis keys, consumer group, dead-letter topic).
        module: Runnable module: ``python -m <module> --generation N --starting-offsets J``.
        topics: Topics it folds.
        tables: Entity tables it writes.
        aggregates: Aggregate hashes it writes.
    """

    name: str
    module: str
    topics: tuple[str, ...]
    tables: tuple[str, ...]
    aggregates: tuple[str, ...]


PROCESSORS: dict[str, ProcessorSpec] = {
    spec.name: spec
    for spec in (
        ProcessorSpec(
            name="order_state",
            module="processors.order_state",
            topics=(ORDERS.name,),
            tables=("orders",),
            aggregates=("order_totals",),
        ),
    )
}


def processor_spec(name: str) -> ProcessorSpec:
    """Look a processor up by name.

    Raises:
        KeyError: With the known names in the message.
    """
    try:
        return PROCESSORS[name]
    except KeyError:
        msg = f"unknown processor {name!r}; known: {', '.join(sorted(PROCESSORS))}"
        raise KeyError(msg) from None
