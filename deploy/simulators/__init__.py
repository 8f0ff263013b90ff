"""Test-data simulators: realistic, deterministic event streams for the demo, tests and bench.

They live here, not in the producer SDK: they make data, the SDK publishes it.
"""

from refold.deploy.simulators.clickstream import SESSION_TIMEOUT_MS, ClickstreamSimulator
from refold.deploy.simulators.orders import (
    OrderSimulator,
    SimulatedEvent,
    customer_id,
    first_orders,
)

__all__ = [
    "SESSION_TIMEOUT_MS",
    "ClickstreamSimulator",
    "OrderSimulator",
    "SimulatedEvent",
    "customer_id",
    "first_orders",
]
