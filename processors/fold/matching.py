"""What one step of a pattern matches: an event type, field conditions, a pure test.

Pure and picklable (shipped to Spark executors inside the pattern fold). Conditions are judged
on an event's fields in canonical JSON form (:func:`canonical`: a time as epoch milliseconds,
a decimal as its text), so live processing, the oracle and every replay judge the same event
the same way:

- a plain value is an equality: ``On("OrderStatusChanged", status="cancelled")``;
- a comparison from :func:`above`, :func:`at_least`, :func:`below`, :func:`at_most`,
  :func:`between`, :func:`not_equal` or :func:`one_of`:
  ``On("TemperatureRead", celsius=above(80))``. A missing field (``None``) never satisfies one;
- ``test=``: a pure, deterministic callable on the whole decoded event, for what comparisons
  cannot say: ``On("TemperatureRead", test=lambda e: e["celsius"] > e["limit"])``. It runs once
  per event when the event is folded, and its verdict is kept with the buffered event.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from refold.processors.fold.eventtime import event_time_ms

__all__ = [
    "Compare",
    "On",
    "Scalar",
    "above",
    "at_least",
    "at_most",
    "below",
    "between",
    "canonical",
    "not_equal",
    "one_of",
]

Scalar = str | int | float | bool | None
Operator = Literal[">", ">=", "<", "<=", "!=", "in", "between"]


def canonical(value: Any) -> Any:
    """``value`` as plain JSON, the same whatever the decoder (times as epoch milliseconds)."""
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, dt.datetime):
        return event_time_ms({"t": value}, "t")
    if isinstance(value, Mapping):
        return {str(k): canonical(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [canonical(v) for v in value]
    if isinstance(value, bytes):
        return value.hex()
    return str(value)  # dates, decimals, enums: their text


@dataclass(frozen=True, slots=True)
class Compare:
    """A comparison of one field with canonical values (build it with :func:`above` & co.)."""

    op: Operator
    values: tuple[Scalar, ...]

    def holds(self, value: Any) -> bool:
        """Whether a field's canonical value satisfies it (a missing one never does)."""
        if value is None:
            return False
        try:
            if self.op == "in":
                return value in self.values
            if self.op == "!=":
                return bool(value != self.values[0])
            if self.op == "between":
                return bool(self.values[0] <= value <= self.values[1])
            bound = self.values[0]
            checks = {
                ">": lambda: value > bound,
                ">=": lambda: value >= bound,
                "<": lambda: value < bound,
                "<=": lambda: value <= bound,
            }
            return bool(checks[self.op]())
        except TypeError:  # a text compared with a number: not satisfied, never an error
            return False

    def __str__(self) -> str:
        if self.op == "between":
            return f" in [{self.values[0]}, {self.values[1]}]"
        if self.op == "in":
            return f" in {{{', '.join(map(str, self.values))}}}"
        return f"{self.op}{self.values[0]}"


def above(bound: Any) -> Compare:
    """The field is greater than ``bound``."""
    return Compare(">", (canonical(bound),))


def at_least(bound: Any) -> Compare:
    """The field is greater than or equal to ``bound``."""
    return Compare(">=", (canonical(bound),))


def below(bound: Any) -> Compare:
    """The field is less than ``bound``."""
    return Compare("<", (canonical(bound),))


def at_most(bound: Any) -> Compare:
    """The field is less than or equal to ``bound``."""
    return Compare("<=", (canonical(bound),))


def between(low: Any, high: Any) -> Compare:
    """``low <= field <= high`` (both inclusive)."""
    return Compare("between", (canonical(low), canonical(high)))


def not_equal(value: Any) -> Compare:
    """The field is present and differs from ``value``."""
    return Compare("!=", (canonical(value),))


def one_of(*values: Any) -> Compare:
    """The field equals one of ``values``."""
    return Compare("in", tuple(canonical(v) for v in values))


@dataclass(frozen=True, slots=True, init=False)
class On:
    """An event type, optionally with field conditions and a test: one step of a pattern.

    ``On("OrderPaid")`` matches every ``OrderPaid``; ``On("OrderStatusChanged",
    status="cancelled")`` only those whose ``status`` is ``cancelled``; ``On("TemperatureRead",
    celsius=above(80))`` those above 80. A field named like a parameter goes through
    ``where={...}``. ``test`` is a pure callable on the decoded event (see the module).
    """

    event_type: str
    where: tuple[tuple[str, Scalar | Compare], ...]
    test: Callable[[Mapping[str, Any]], bool] | None

    def __init__(
        self,
        event_type: str,
        /,
        where: Mapping[str, Any] | None = None,
        *,
        test: Callable[[Mapping[str, Any]], bool] | None = None,
        **fields: Any,
    ) -> None:
        merged = {**(where or {}), **fields}
        conditions = tuple(
            sorted(
                ((k, v if isinstance(v, Compare) else canonical(v)) for k, v in merged.items()),
                key=lambda kv: kv[0],
            )
        )
        object.__setattr__(self, "event_type", event_type)
        object.__setattr__(self, "where", conditions)
        object.__setattr__(self, "test", test)

    @property
    def fields(self) -> tuple[str, ...]:
        """The fields its conditions read (a pattern fold keeps them with a buffered event)."""
        return tuple(k for k, _v in self.where)

    @property
    def test_key(self) -> str:
        """Where a buffered event keeps this step's test verdict (a reserved field name)."""
        return f"?{self.label}"

    def judge(self, event: Mapping[str, Any]) -> bool:
        """Run the test on a decoded event (when folded; the verdict is kept with it)."""
        return self.test is None or bool(self.test(event))

    def matches(self, event_type: str, fields: Mapping[str, Any]) -> bool:
        """Whether an event of ``event_type`` with these (canonical) fields matches."""
        if event_type != self.event_type:
            return False
        for name, wanted in self.where:
            value = fields.get(name)
            if isinstance(wanted, Compare):
                if not wanted.holds(value):
                    return False
            elif value != wanted:
                return False
        return self.test is None or fields.get(self.test_key) is True

    @property
    def label(self) -> str:
        """``TemperatureRead[celsius>80]``: for insights' details."""
        parts = [f"{k}{v}" if isinstance(v, Compare) else f"{k}={v}" for k, v in self.where]
        if self.test is not None:
            parts.append(f"test={getattr(self.test, '__qualname__', 'test')}")
        return f"{self.event_type}[{','.join(parts)}]" if parts else self.event_type
