"""A realistic, deterministic stream of order events for the demo, the tests and the benchmark.

Orders are interleaved the way a shop's traffic is: many carts are open at once, each goes
through placed -> line edits -> paid -> shipped (or is cancelled, or abandoned). A small share of
anomalies (shipping before payment, paying the wrong amount) exercises the dead-letter path.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

__all__ = ["OrderSimulator", "SimulatedEvent", "customer_id", "first_orders"]

SimulatedEvent = tuple[str, dict[str, Any]]

_CURRENCIES = (("EUR", 5), ("USD", 4), ("GBP", 1))
_CARRIERS = ("DHL", "UPS", "PostNL", "DPD")
_METHODS = ("CARD", "BANK_TRANSFER", "WALLET")
_CHANNELS = ("web", "app", "store")
_BASE_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z


def customer_id(number: int) -> str:
    """The id of the ``number``-th simulated customer (``cus-000001``...), shared by simulators.

    Orders and the clickstream use the same ids, so commerce and web events join on them.
    """
    return f"cus-{number:06d}"


def first_orders(events: Iterable[SimulatedEvent]) -> dict[str, int]:
    """Each customer's first ``placed_at``: when, at the latest, it needs an account.

    Pass it to the clickstream simulator (``registered_by``) so that every customer who orders
    has a profile on ``crm.customers`` from before its first order.
    """
    first: dict[str, int] = {}
    for event_type, event in events:
        if event_type == "OrderPlaced":
            customer, at = str(event["customer_id"]), int(event["placed_at"])
            first[customer] = min(first.get(customer, at), at)
    return first


@dataclass(slots=True)
class _Cart:
    order_id: str
    currency: str
    lines: dict[str, tuple[int, int]] = field(default_factory=dict)
    edits_left: int = 0
    stage: str = "placed"
    anomaly: bool = False

    @property
    def total(self) -> int:
        return sum(qty * price for qty, price in self.lines.values())


class OrderSimulator:
    """Generates ``(event_type, event)`` pairs; the same seed gives the same stream.

    Args:
        orders: Number of orders to run through their lifecycle.
        seed: Random seed.
        anomaly_rate: Share of orders that get one event the fold must reject.
        concurrency: Open carts at a time (how interleaved the stream is).
        order_prefix: Prefix of the order ids (``ord-0000001``...); two simulators that write
            to the same topic need different prefixes, or their orders collide.

    Orders are placed by the customers :attr:`customer_ids`, picked uniformly.
    """

    def __init__(
        self,
        orders: int,
        seed: int = 7,
        anomaly_rate: float = 0.002,
        concurrency: int = 500,
        order_prefix: str = "ord-",
    ) -> None:
        self.orders = orders
        self.anomaly_rate = anomaly_rate
        self.concurrency = concurrency
        self.order_prefix = order_prefix
        self._rng = random.Random(seed)  # noqa: S311 - test data, not security
        self._clock = _BASE_MS

    @property
    def customer_count(self) -> int:
        """How many customers place the orders (one per three orders)."""
        return max(1, self.orders // 3)

    @property
    def customer_ids(self) -> tuple[str, ...]:
        """Every customer id orders may carry; pass them to the clickstream simulator."""
        return tuple(customer_id(n) for n in range(1, self.customer_count + 1))

    def _id(self) -> str:
        return str(uuid.UUID(int=self._rng.getrandbits(128), version=4))

    def _tick(self) -> int:
        self._clock += self._rng.randint(1, 400)
        return self._clock

    def _sku(self) -> tuple[str, int, int]:
        return (
            f"SKU-{self._rng.randint(1, 2000):04d}",
            self._rng.choice((1, 1, 1, 2, 3)),
            self._rng.randrange(199, 20_000, 50),
        )

    def __iter__(self) -> Iterator[SimulatedEvent]:
        rng = self._rng
        open_carts: list[_Cart] = []
        started = 0
        while started < self.orders or open_carts:
            if started < self.orders and len(open_carts) < self.concurrency:
                started += 1
                cart = _Cart(
                    order_id=f"{self.order_prefix}{started:07d}",
                    currency=rng.choices([c for c, _ in _CURRENCIES], [w for _, w in _CURRENCIES])[
                        0
                    ],
                    edits_left=rng.randint(0, 14),
                    anomaly=rng.random() < self.anomaly_rate,
                )
                open_carts.append(cart)
                yield self._placed(cart, started)
                continue
            index = rng.randrange(len(open_carts))
            cart = open_carts[index]
            event = self._advance(cart)
            if cart.stage == "done":
                open_carts[index] = open_carts[-1]
                open_carts.pop()
            if event is not None:
                yield event

    def _placed(self, cart: _Cart, number: int) -> SimulatedEvent:
        lines = []
        for _ in range(self._rng.randint(1, 3)):
            sku, qty, price = self._sku()
            old_qty = cart.lines.get(sku, (0, 0))[0]
            cart.lines[sku] = (old_qty + qty, price)
            lines.append({"sku": sku, "qty": qty, "unit_price_minor": price})
        return "OrderPlaced", {
            "event_id": self._id(),
            "order_id": cart.order_id,
            "customer_id": customer_id(self._rng.randint(1, self.customer_count)),
            "lines": lines,
            "currency": cart.currency,
            "placed_at": self._tick(),
            "channel": self._rng.choice(_CHANNELS),
            "coupon_code": "WELCOME10" if number % 17 == 0 else None,
        }

    def _advance(self, cart: _Cart) -> SimulatedEvent | None:
        rng = self._rng
        base = {"event_id": self._id(), "order_id": cart.order_id}
        if cart.anomaly:
            cart.anomaly = False
            if cart.stage == "placed":
                return "OrderShipped", {
                    **base,
                    "carrier": "DHL",
                    "tracking_number": "X",
                    "shipped_at": self._tick(),
                }
            return "OrderPaid", {
                **base,
                "amount_minor": 1,
                "currency": cart.currency,
                "payment_method": "CARD",
                "paid_at": self._tick(),
            }
        if cart.stage == "placed" and cart.edits_left > 0:
            cart.edits_left -= 1
            if len(cart.lines) > 1 and rng.random() < 0.3:
                sku = rng.choice(sorted(cart.lines))
                del cart.lines[sku]
                return "OrderLineRemoved", {**base, "sku": sku, "removed_at": self._tick()}
            sku, qty, price = self._sku()
            old_qty = cart.lines.get(sku, (0, 0))[0]
            cart.lines[sku] = (old_qty + qty, price)
            return "OrderLineAdded", {
                **base,
                "sku": sku,
                "qty": qty,
                "unit_price_minor": price,
                "added_at": self._tick(),
            }
        if cart.stage == "placed":
            roll = rng.random()
            if roll < 0.07:
                cart.stage = "done"  # abandoned cart: stays placed
                return None
            if roll < 0.12:
                cart.stage = "done"
                return "OrderCancelled", {
                    **base,
                    "reason": "customer request",
                    "cancelled_at": self._tick(),
                }
            cart.stage = "paid"
            return "OrderPaid", {
                **base,
                "amount_minor": cart.total,
                "currency": cart.currency,
                "payment_method": rng.choice(_METHODS),
                "paid_at": self._tick(),
            }
        if cart.stage == "paid":
            cart.stage = "done"
            if rng.random() < 0.05:
                return "OrderCancelled", {
                    **base,
                    "reason": "payment refunded",
                    "cancelled_at": self._tick(),
                }
            return "OrderShipped", {
                **base,
                "carrier": rng.choice(_CARRIERS),
                "tracking_number": f"TRK{rng.randint(10**9, 10**10 - 1)}",
                "shipped_at": self._tick(),
            }
        cart.stage = "done"
        return None
