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
from pathlib import Path
from typing import Any

import orjson

from refold.contracts.codec import EventCodec
from refold.processors.fold.projection import EventRejectedError, State
from refold.processors.order_state.projection import OrderStateProjection

__all__ = ["OrderFold", "Progress"]

_WRITE_EVERY_S = 1.0


class OrderFold:
    """order_state's fold as a peer runs it: refold's decoder, then the projection's rules.

    A rejected event (refold dead-letters it) leaves the state as it was.
    """

    def __init__(self) -> None:
        self.codec = EventCodec()
        self.projection = OrderStateProjection()

    def __call__(self, state: State | None, value: bytes) -> State | None:
        """The state after the record ``value`` (Avro single-object encoded)."""
        event = self.codec.decode(value)
        try:
            return self.projection.apply(state, event.event_type, event.data)
        except EventRejectedError:
            return state


class Progress:
    """A peer process's progress file and, for an in-memory variant, its final states."""

    def __init__(self, path: Path, ends: Mapping[int, int], *, keep_states: bool) -> None:
        self.path = path
        self.ends = dict(ends)
        self.first: float | None = None
        self.offsets: dict[int, int] = {}
        self.reached: dict[int, float] = {}
        self.states: dict[str, tuple[int, bytes]] | None = {} if keep_states else None
        self._written = 0.0

    def seen(self, key: str, partition: int, offset: int, state: State | None) -> None:
        """One record folded."""
        now = time.time()
        if self.first is None:
            self.first = now
            self.write()
        if offset > self.offsets.get(partition, -1):
            self.offsets[partition] = offset
        if self.states is not None and state is not None:
            self.states[key] = (offset, orjson.dumps(state))
        if offset + 1 >= self.ends.get(partition, 0) and partition not in self.reached:
            self.reached[partition] = now
            self.write()
        elif now - self._written >= _WRITE_EVERY_S:
            self.write()

    def write(self) -> None:
        """Rewrite the progress file."""
        self._written = time.time()
        body: dict[str, Any] = {
            "first": self.first,
            "offsets": self.offsets,
            "reached": self.reached,
        }
        tmp = self.path.with_suffix(".tmp")
        tmp.write_bytes(orjson.dumps(body, option=orjson.OPT_NON_STR_KEYS))
        os.replace(tmp, self.path)

    def dump_states(self, path: Path) -> None:
        """Write the kept states (in-memory variants), once the run is over."""
        states = self.states or {}
        path.write_bytes(
            b"{"
            + b",".join(
                orjson.dumps(key) + b":[" + str(offset).encode() + b"," + state + b"]"
                for key, (offset, state) in states.items()
            )
            + b"}"
        )
