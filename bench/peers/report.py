"""What a peer's process reports: its progress through the backlog, and its final states.

Shared by the Python peers (they run in ``.venv-peers``, so this imports only refold's codec and
projection); the JVM peers write the same two files. The progress file, rewritten whole
(``os.replace``), is JSON: ``{"first": epoch s, "offsets": {partition: last offset folded},
"reached": {partition: epoch s the partition's last record was folded}}``. The states file
(in-memory variants) is JSON: ``{key: [offset, state]}``; the offset lets the orchestrator
merge two processes' states when a rebalance moved a partition between them.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from io import BytesIO
from pathlib import Path
from typing import Any

import fastavro
import fastavro.schema
import orjson

from refold.processors.fold.projection import EventRejectedError, State
from refold.processors.order_state.projection import OrderStateProjection

__all__ = ["OrderFold", "Progress", "dump_states"]

_WRITE_EVERY_S = 1.0
_SCHEMAS = Path(__file__).parent.parent.parent / "refold" / "contracts" / "schemas" / "commerce"


class OrderFold:
    """order_state's fold as a peer's user writes it: fastavro, then the projection's rules.

    The decode is the one a Python user writes for Avro single-object records: the ``.avsc``
    files parsed once, the writer schema found by the record's fingerprint, fastavro's
    ``schemaless_reader`` resolving it to the newest version of its record (refold's own
    decoder costs ~0.8 us a record more: it checks the header, the body's length and builds
    a ``DecodedEvent``). Logical types are left off, as refold reads them, since the fold's
    rules take epoch milliseconds. A rejected event (refold dead-letters it) leaves the state
    as it was.
    """

    def __init__(self, schemas: Path = _SCHEMAS) -> None:
        self.projection = OrderStateProjection()
        self.plans: dict[bytes, tuple[str, Any, Any]] = {}  # fingerprint -> name, writer, reader
        newest: dict[str, tuple[int, Any]] = {}
        loaded = []
        for path in sorted(schemas.glob("*.avsc")):
            name, version = path.name.split(".")[:2]
            raw = _plain(orjson.loads(path.read_bytes()))
            parsed = fastavro.parse_schema(raw)
            canonical = fastavro.schema.to_parsing_canonical_form(raw)
            key = bytes.fromhex(fastavro.schema.fingerprint(canonical, "CRC-64-AVRO"))
            loaded.append((key, name, parsed))
            if int(version[1:]) > newest.get(name, (0, None))[0]:
                newest[name] = (int(version[1:]), parsed)
        for key, name, parsed in loaded:
            reader = newest[name][1]
            self.plans[key] = (name, parsed, None if reader is parsed else reader)

    def __call__(self, state: State | None, value: bytes) -> State | None:
        """The state after the record ``value`` (Avro single-object encoded)."""
        name, writer, reader = self.plans[value[2:10]]
        body = BytesIO(value)
        body.seek(10)
        data = fastavro.schemaless_reader(body, writer, reader)
        try:
            return self.projection.apply(state, name, data)  # type: ignore[arg-type]
        except EventRejectedError:
            return state


def _plain(schema: Any) -> Any:
    """``schema`` without its ``logicalType`` annotations."""
    if isinstance(schema, dict):
        return {k: _plain(v) for k, v in schema.items() if k != "logicalType"}
    if isinstance(schema, list):
        return [_plain(item) for item in schema]
    return schema


class Progress:
    """A peer process's progress file: light enough to sit in the fold's path.

    Per record a peer calls :meth:`seen` (a few comparisons; the clock is read at the first
    record, at each partition's last and every 8,192 records) or, per batch of a sink,
    :meth:`seen_batch`; a bounded fold that emits its states at the end calls :meth:`finished`.
    Nothing here copies or encodes a state: the final states are read after the timed run
    (:meth:`dump_states`, a store or the Redis keys).
    """

    def __init__(self, path: Path, ends: Mapping[int, int]) -> None:
        self.path = path
        self.ends = dict(ends)
        self.first: float | None = None
        self.offsets: dict[int, int] = {}
        self.reached: dict[int, float] = {}
        self.done: float | None = None  # a bounded fold's end (every partition at its end)
        self._count = 0
        self._written = 0.0

    def seen(self, partition: int, offset: int) -> None:
        """One record folded."""
        if self.first is None:
            self.first = time.time()
            self.write()
        if offset + 1 >= self.ends.get(partition, 0):
            if partition not in self.reached:
                self.offsets[partition] = offset
                self.reached[partition] = time.time()
                self.write()
            return
        self._count += 1
        if not self._count & 8191:
            self.offsets[partition] = offset
            if time.time() - self._written >= _WRITE_EVERY_S:
                self.write()

    def seen_batch(self, last: Mapping[int, int]) -> None:
        """A batch folded; ``last``: its highest offset per partition."""
        for partition, offset in last.items():
            self.seen(partition, offset)

    def finished(self) -> None:
        """A bounded fold emitted its final states: every partition it read is at its end."""
        self.done = time.time()
        self.write()

    def write(self) -> None:
        """Rewrite the progress file."""
        self._written = time.time()
        body: dict[str, Any] = {
            "first": self.first,
            "offsets": self.offsets,
            "reached": self.reached,
            "done": self.done,
        }
        tmp = self.path.with_suffix(".tmp")
        tmp.write_bytes(orjson.dumps(body, option=orjson.OPT_NON_STR_KEYS))
        os.replace(tmp, self.path)


def dump_states(path: Path, states: Mapping[str, State]) -> None:
    """Write a process's final states (``{key: [0, state]}``, read by ``merged_states``)."""
    path.write_bytes(orjson.dumps({key: [0, state] for key, state in states.items()}))
