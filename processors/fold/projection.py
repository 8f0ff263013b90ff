"""The contract between a processor's pure fold and the Spark/Redis machinery around it.

A :class:`Projection` is plain Python: no Spark, no Redis, no I/O. The sink calls it on
executors; the tests' oracle and the benchmark baseline call the same object in one process, so
"live state == oracle" compares the wiring, not two copies of the logic.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Any, Protocol, cast

import orjson

from refold.contracts.codec import EventCodec
from refold.contracts.errors import ContractError, RefoldError
from refold.contracts.registry import default_registry
from refold.contracts.schema_registry import Framing

__all__ = [
    "EventRejectedError",
    "FoldError",
    "InvalidOutputError",
    "Projection",
    "SideEffect",
    "State",
    "UnstorableStateError",
    "effects_of",
    "encode_effects",
    "fits_int64",
    "fold_one",
    "output_codec",
    "store_state",
]

State = dict[str, Any]

# Redis counters (HINCRBY) are signed 64-bit; a contribution outside would fail in Redis.
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def fits_int64(value: int) -> bool:
    """True when ``value`` fits a Redis counter (signed 64 bits)."""
    return _INT64_MIN <= value <= _INT64_MAX


class EventRejectedError(RefoldError):
    """The fold refuses an event (it breaks a domain rule); the event goes to the dead letters."""

    code = "EVENT_REJECTED"


class FoldError(EventRejectedError):
    """The fold raised something other than :class:`EventRejectedError` for one record."""

    code = "FOLD_ERROR"


class InvalidOutputError(EventRejectedError):
    """A side effect does not fit its contract (or is not JSON): the record is dead-lettered.

    A processor's outputs are checked like producers' events, at fold time, so a record whose
    output would be refused downstream is never applied (reason ``invalid-output``).
    """

    code = "OUTPUT_INVALID"


class UnstorableStateError(RefoldError):
    """A record would leave a state that cannot be stored; the record goes to the dead letters.

    Attributes:
        reason: ``unserialisable`` (not JSON, e.g. an integer beyond 64 bits) or ``overflow``
            (a contribution to the aggregate counters is not a signed 64-bit integer).
    """

    code = "STATE_UNSTORABLE"

    def __init__(self, detail: str, *, reason: str) -> None:
        self.reason = reason
        super().__init__(f"{reason}: {detail}")


def store_state(projection: Projection, state: State) -> tuple[bytes, Mapping[str, int]]:
    """Serialise a state and compute its contribution, or say why it cannot be stored.

    Checked after every record (by the sink and by the oracle alike), so whether a record is
    applied never depends on how records were grouped into batches.

    Returns:
        The state's JSON and its contribution to the aggregate counters.

    Raises:
        UnstorableStateError: Not serialisable, or a contribution outside signed 64 bits.
    """
    try:
        encoded = orjson.dumps(state)
    except (TypeError, ValueError) as exc:  # orjson.JSONEncodeError is a TypeError
        msg = f"the new state is not storable: {exc}"
        raise UnstorableStateError(msg, reason="unserialisable") from exc
    contribution = projection.contribution(state)
    # Typed as ints, but user code may hand back anything: checked at run time.
    for name, value in cast("Mapping[str, object]", contribution).items():
        if not isinstance(value, int) or not fits_int64(value):
            msg = f"contribution {name}={value!r} is not a signed 64-bit integer"
            raise UnstorableStateError(msg, reason="overflow")
    return encoded, contribution


@dataclass(frozen=True, slots=True)
class SideEffect:
    """Something a fold asks of the outside world: a JSON record on an output topic.

    A projection that has side effects defines ``effects(event_type, event, before, after)``
    returning them for one applied event, and ``effect_topics`` naming the topics (created at
    start). The sink produces them before it commits the state, like dead letters: at least
    once, with the origin record in the headers for consumers that deduplicate. A generation
    that ``replay`` is building does not produce those of records the live generation has
    already applied (they were produced then); it counts them as suppressed.

    With a ``contract`` (a record name of an installed contract set, e.g. ``Insight``), the
    value is checked against and written with that Avro contract, as producers write events, so
    another processor can fold the topic (processors chain). Without one it is JSON.
    """

    topic: str
    key: str
    value: Mapping[str, Any]
    contract: str | None = None
    # The value as produced (Avro in its topic's framing, or JSON), filled by encode_effects.
    payload: bytes | None = field(default=None, compare=False, repr=False)


@cache
def output_codec() -> EventCodec:
    """The codec of output contracts: every installed contract set (one per process)."""
    return EventCodec()


@cache
def output_framing(topic: str) -> Framing:
    """How an output topic's records are written: its contract set's framing (one per topic)."""
    return default_registry().framing(topic)


def encode_effects(effects: Iterable[SideEffect]) -> list[SideEffect]:
    """The effects with their payloads: checked against their contracts, or JSON.

    Raises:
        InvalidOutputError: An effect's value does not fit its contract (the message names each
            wrong field), names an unknown contract, or is not JSON.
    """
    out = []
    for effect in effects:
        try:
            if effect.contract is None:
                payload = orjson.dumps(effect.value)
            else:
                payload = output_codec().encode_checked(
                    effect.contract, dict(effect.value), output_framing(effect.topic)
                )
        except (ContractError, TypeError, ValueError) as exc:  # JSONEncodeError is a TypeError
            msg = f"output to {effect.topic} is invalid: {exc}"
            raise InvalidOutputError(msg) from exc
        # (the constructor: dataclasses.replace costs 3x as much, per output)
        out.append(SideEffect(effect.topic, effect.key, effect.value, effect.contract, payload))
    return out


class Projection(Protocol):
    """A pure fold of events into one state per entity, plus integer aggregates.

    Implementations must be picklable (shipped to Spark executors) and deterministic. Side
    effects are optional (see :class:`SideEffect`).
    """

    @property
    def name(self) -> str:
        """Processor name: Redis keys, consumer group and dead-letter topic derive from it."""
        ...

    @property
    def table(self) -> str:
        """Name of the per-entity state table."""
        ...

    @property
    def aggregate(self) -> str:
        """Name of the aggregate hash maintained from the entity states."""
        ...

    @property
    def event_types(self) -> tuple[str, ...]:
        """The event types this projection folds; others are dead-lettered."""
        ...

    def key(self, event_type: str, event: Mapping[str, Any]) -> str:
        """The entity an event belongs to."""
        ...

    def apply(self, state: State | None, event_type: str, event: Mapping[str, Any]) -> State:
        """Return the entity's new state; never mutate ``state``.

        Raises:
            EventRejectedError: The event is not valid for this state.
        """
        ...

    def contribution(self, state: State) -> Mapping[str, int]:
        """What one entity state adds to the aggregate counters.

        The sink applies ``contribution(new) - contribution(old)`` per changed entity, so the
        aggregate always equals the sum over all entities.
        """
        ...


def effects_of(
    projection: Projection,
    event_type: str,
    event: Mapping[str, Any],
    before: State | None,
    after: State,
) -> list[SideEffect]:
    """The side effects of one applied event (none when the projection declares none)."""
    effects = getattr(projection, "effects", None)
    return [] if effects is None else list(effects(event_type, event, before, after))


def fold_one(
    projection: Projection, state: State | None, event_type: str, event: Mapping[str, Any]
) -> tuple[State, bytes, Mapping[str, int], list[SideEffect]]:
    """Apply one event and check the outcome: the one rule for the sink and the oracle.

    Returns:
        The new state, its JSON, its contribution and the event's side effects.

    Raises:
        EventRejectedError: The fold refuses the event, or the fold itself failed (any
            exception from user code is wrapped, reason ``fold-error``), or one of its side
            effects does not fit its contract (:class:`InvalidOutputError`).
        UnstorableStateError: The new state cannot be stored.
    """
    try:
        new = projection.apply(state, event_type, event)
        effects = effects_of(projection, event_type, event, state, new)
    except EventRejectedError:
        raise
    except Exception as exc:  # user code: one record's failure must not stop the stream
        msg = f"the fold raised {exc!r}"
        raise FoldError(msg) from exc
    encoded, contribution = store_state(projection, new)
    return new, encoded, contribution, encode_effects(effects) if effects else effects
