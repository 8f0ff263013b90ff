"""How a query reads: one generation per answer, after the positions the client asked for.

:func:`read_consistent` runs a read (which resolves the live alias once and reads that one
generation) until the generation it read has applied the client's positions, waiting up to the
client's budget; :func:`etag_of` names an answer's representation.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import orjson
import redis

from refold.contracts.layout import parse_position_field, position_field
from refold.contracts.processors import ProcessorSpec
from refold.contracts.registry import default_registry
from refold.contracts.store.generations import GenerationRegistry
from refold.contracts.store.positions import GenerationPositions
from refold.services.api.errors import ApiError
from refold.services.consistency import Positions, decode_token, parse_min_positions, unmet
from refold.services.errors import NoLiveGenerationError, StateRebuildingError
from refold.services.reader.state_reader import StateView

__all__ = [
    "Consistency",
    "etag_of",
    "freshness",
    "not_modified",
    "processor",
    "read_consistent",
    "topics_of",
]

# How often a waiting query looks at the positions again: a micro-batch takes ~0.3-1 s here,
# so 20 ms adds little to a read-your-writes wait and costs one HGETALL per poll.
_POLL_S = 0.02


@dataclass(frozen=True, slots=True)
class Consistency:
    """What a request asked for: positions to wait for, and how long it may wait.

    Attributes:
        needed: ``(topic, partition)`` -> offset the live generation must have applied.
        wait_s: The longest wait; 0 answers 409 at once when they are not applied.
    """

    needed: Positions
    wait_s: float

    @classmethod
    def of(
        cls,
        token: str | None,
        min_positions: str | None,
        wait_ms: int | None,
        *,
        default_wait_ms: int,
        max_wait_s: float,
    ) -> Consistency:
        """From a request's ``consistency_token``, ``min_positions`` and ``wait_ms``."""
        needed: Positions = {}
        for part in (
            decode_token(token) if token else {},
            parse_min_positions(min_positions) if min_positions else {},
        ):
            for tp, offset in part.items():
                needed[tp] = max(needed.get(tp, 0), offset)
        wait_ms = default_wait_ms if wait_ms is None else wait_ms
        return cls(needed, min(wait_ms / 1000, max_wait_s))


def processor(name: str) -> ProcessorSpec:
    """The registered processor ``name`` (UnknownProcessorError, a 404, otherwise)."""
    return default_registry().processor(name)


def topics_of(
    client: redis.Redis, spec: ProcessorSpec, key_prefix: str, generation: int
) -> list[str]:
    """The topics a generation reads: its metadata (options may rename them), else the spec's."""
    registry = GenerationRegistry.of(client, spec.name, key_prefix)
    recorded = registry.meta(generation).get("topics")
    return list(json.loads(recorded)) if recorded else list(spec.topics)


def freshness(spec: ProcessorSpec, view: StateView) -> dict[str, Any]:
    """The freshness fields of every answer."""
    return {
        "processor": spec.name,
        "generation": view.generation,
        "positions": {position_field(t, p): o for (t, p), o in sorted(view.positions.items())},
    }


async def read_consistent(
    client: redis.Redis,
    spec: ProcessorSpec,
    key_prefix: str,
    consistency: Consistency,
    read: Callable[[], StateView | Awaitable[StateView]],
) -> StateView:
    """``read()`` once its generation has applied ``consistency.needed`` (of its topics).

    The read's own positions (read with the value, in one transaction where the reader can)
    are what is checked, so the answer reflects every position asked for, even across a flip.
    ``read`` may be a coroutine function (an asyncio client's round trip), awaited each time.

    A generation still catching up from far behind the log (``StateRebuildingError``) is
    waited for like positions when the client asked for some and has budget left; else it is
    503 ``REBUILDING`` with ``Retry-After``.

    Raises:
        ApiError: 409 (``wait_ms=0``) or 504 (waited in vain), with the positions applied;
            503 ``REBUILDING``.
    """
    deadline = time.monotonic() + consistency.wait_s
    topics: list[str] | None = None
    registry = GenerationRegistry.of(client, spec.name, key_prefix)
    while True:
        try:
            answer = read()
            view = await answer if inspect.isawaitable(answer) else answer
        except NoLiveGenerationError:
            # A token names writes the processor will apply: its first generation may be
            # about to appear (a processor just started). Wait for it like for positions.
            if not consistency.needed or time.monotonic() >= deadline:
                raise
            await asyncio.sleep(_POLL_S)
            continue
        except StateRebuildingError as exc:
            if not consistency.needed or time.monotonic() >= deadline:
                raise _rebuilding(spec, exc) from exc
            await asyncio.sleep(_POLL_S)
            continue
        if not consistency.needed:
            return view
        if topics is None:
            topics = topics_of(client, spec, key_prefix, view.generation)
        missing = unmet(consistency.needed, view.positions, topics)
        if missing:
            view = _with_other_shards(registry, view, missing)
            missing = unmet(missing, view.positions, topics)
        if not missing:
            return view
        if time.monotonic() >= deadline:
            raise _not_applied(spec, view, missing, consistency.wait_s)
        await asyncio.sleep(_POLL_S)


def _with_other_shards(
    registry: GenerationRegistry, view: StateView, missing: Positions
) -> StateView:
    """``view`` with the positions of the ``missing`` partitions that other shards hold.

    A read of a sharded generation returns the positions of the shards it read (an entity's:
    its partition's). A token may name other partitions, which that state does not depend on
    (every event of an entity is on its partition): they are read from their shards, in one
    HMGET each, and must be applied too. Unsharded, a view holds every position: ``view``.
    """
    absent = [(t, p) for t, p in missing if (t, p) not in view.positions]
    if not absent:  # unsharded, every partition the generation started is in the view
        return view
    keys = registry.keys(view.generation)  # read once per registry
    fields = [position_field(t, p) for t, p in absent if p < keys.shards]
    if not fields:
        return view
    found = GenerationPositions(registry.client, keys).read_fields(fields)
    if not found:
        return view
    positions = {**view.positions}
    for field, offset in found.items():
        parsed = parse_position_field(field)
        if parsed is not None:
            positions[parsed] = offset
    return StateView(view.generation, view.value, positions)


def _rebuilding(spec: ProcessorSpec, exc: StateRebuildingError) -> ApiError:
    """503 ``REBUILDING``: the generation's state is not complete yet, not "not found"."""
    view = StateView(exc.generation, None, exc.positions)
    return ApiError(
        503,
        "REBUILDING",
        str(exc),
        headers={"Retry-After": str(exc.retry_after_s)},
        **freshness(spec, view),
        behind={position_field(t, p): o for (t, p), o in sorted(exc.behind.items())},
    )


def _not_applied(
    spec: ProcessorSpec, view: StateView, missing: Positions, waited: float
) -> ApiError:
    wanted = ", ".join(
        f"{position_field(t, p)}:{o} (applied {view.positions.get((t, p), 0)})"
        for (t, p), o in sorted(missing.items())[:5]
    )
    details = {
        **freshness(spec, view),
        "missing": {position_field(t, p): o for (t, p), o in sorted(missing.items())},
    }
    if waited <= 0:
        msg = (
            f"{spec.name} g{view.generation} has not applied {wanted} yet; ask with wait_ms > 0 "
            "to wait for it"
        )
        return ApiError(409, "CONSISTENCY_NOT_MET", msg, **details)
    msg = (
        f"{spec.name} g{view.generation} did not apply {wanted} within {waited * 1000:.0f} ms. "
        "Operator action: check the processor's lag (GET /v1/processors/"
        f"{spec.name}/lag); it may be behind or stopped."
    )
    return ApiError(504, "CONSISTENCY_TIMEOUT", msg, **details)


def json_default(value: Any) -> Any:
    """JSON for what orjson does not know: a decimal window measure is a JSON number.

    A double carries it exactly up to 15 significant digits (``12345678901.25``); the Python
    readers return the exact :class:`~decimal.Decimal`.
    """
    if isinstance(value, Decimal):
        return float(value)
    msg = f"{type(value).__name__} is not JSON serialisable"
    raise TypeError(msg)


def etag_of(generation: int, value: Any) -> str:
    """A weak ETag of an answer's data (positions may move while the data stays the same)."""
    body = orjson.dumps(value, default=json_default, option=orjson.OPT_SORT_KEYS)
    digest = hashlib.blake2b(body, digest_size=12)
    return f'W/"g{generation}-{digest.hexdigest()}"'


def not_modified(if_none_match: str | None, etag: str) -> bool:
    """Whether the client's ``If-None-Match`` already names ``etag``."""
    if not if_none_match:
        return False
    return if_none_match.strip() == "*" or etag in {t.strip() for t in if_none_match.split(",")}
