"""A task's outcome crossing from an executor to the driver as one Arrow row.

Spark's ``mapInArrow`` returns rows; the sinks (fold, archive) send one per task with what it
did, and the driver adds them up. The row's schema, both conversions and Spark's DDL string are
derived from the outcome dataclass here: counters (``int`` fields) travel as longs, anything
else (positions, dead letters per reason) as JSON. A field added to the dataclass travels with
no other edit; four hand-kept lists that had to agree broke every Spark fold once, when one
gained a field and another shifted by position.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from typing import Any, Generic, TypeVar

import pyarrow as pa

__all__ = ["OutcomeRows"]

_O = TypeVar("_O")


class OutcomeRows(Generic[_O]):
    """The row form of the outcome dataclass ``kind``.

    Args:
        kind: A dataclass whose fields are ``int`` counters or JSON-serialisable values.
    """

    def __init__(self, kind: type[_O]) -> None:
        self.kind = kind
        self._fields = [f.name for f in dataclasses.fields(kind)]  # type: ignore[arg-type]
        self._json = frozenset(
            f.name
            for f in dataclasses.fields(kind)  # type: ignore[arg-type]
            if f.type not in ("int", int)
        )
        self.arrow = pa.schema(
            [(n, pa.string() if n in self._json else pa.int64()) for n in self._fields]
        )
        self.ddl = ", ".join(f"{n} {'string' if n in self._json else 'long'}" for n in self._fields)

    def rows(self, outcome: _O) -> Iterator[pa.RecordBatch]:
        """``outcome`` as one Arrow row (executor side)."""
        row = {
            name: json.dumps(value) if name in self._json else value
            for name in self._fields
            for value in (getattr(outcome, name),)
        }
        yield pa.RecordBatch.from_pylist([row], schema=self.arrow)

    def of_row(self, row: Any) -> _O:
        """The outcome back from a collected row (driver side), field by field by name."""
        return self.kind(
            **{
                name: json.loads(getattr(row, name)) if name in self._json else getattr(row, name)
                for name in self._fields
            }
        )
