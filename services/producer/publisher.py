"""The producer SDK: validate against the contract, encode, key by aggregate id, publish.

Delivery is acks=all with idempotence, and keys are partitioned with ``murmur2_random`` (the
Java client's default), so Python and JVM producers put one aggregate on the same partition.

A call that is not acknowledged in time does not leave its events behind: it purges them from the
producer and raises :class:`~refold.services.errors.PublishError` naming them (see there for what a
purged event may or may not have become).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson
from confluent_kafka import KafkaError, Message, Producer

from refold.contracts.codec import EventCodec
from refold.contracts.errors import ContractError, EventTooLargeError, UnknownEventTypeError
from refold.contracts.kafka.credentials import is_refusal, refused
from refold.contracts.kafka.delivery import announce, durable
from refold.contracts.kafka.logs import routed
from refold.contracts.lock import PublishGate, default_publish_gate
from refold.contracts.registry import default_registry
from refold.contracts.schema_registry import Framing
from refold.contracts.settings import KafkaSettings
from refold.contracts.topics import TopicSpec
from refold.services.errors import PublishError, UnacknowledgedEvent

__all__ = ["DeliveryToken", "EventPublisher"]

logger = logging.getLogger(__name__)

# Producer tuning, each with its reason:
_WHO = "the producer SDK"
_PRODUCER_DEFAULTS = {
    # acks=all (an accepted event is on every in-sync replica) and idempotence (retries never
    # duplicate or reorder) go over the user's settings: contracts/kafka/delivery.py
    "partitioner": "murmur2_random",  # same key -> same partition as the Java client
    "linger.ms": "5",  # batch small events; ~1.2M/s pre-encoded vs ~100k/s unbatched here
    "compression.type": "lz4",  # cheap on CPU, halves the log for JSON-like payloads
    "queue.buffering.max.messages": "500000",  # room for batch emits without BufferError
    # librdkafka's own give-up time per message (its default is 300 s). emit/emit_many purge
    # what is left at their own timeout, so this is the backstop for messages no call waits on
    # (those queued before an invalid event stopped emit_many): they fail after 2 minutes, not
    # 5. It is above both default call timeouts (30 s, 60 s), so with those a call ends by its
    # own purge, with its own message. KafkaSettings.client_properties can override it.
    "message.timeout.ms": "120000",
}
# After a purge, how long to serve the purged messages' delivery reports. A purge is local (no
# broker round trip), so the reports are ready at once; this only bounds a wedged client.
_PURGE_DRAIN_S = 5.0
_MESSAGE_MAX_BYTES = 1_000_000  # librdkafka's default message.max.bytes
# How many unacknowledged events the error message names; all are in PublishError.unacknowledged.
_NAMED_IN_MESSAGE = 5


@dataclass(frozen=True, slots=True)
class DeliveryToken:
    """Where an accepted event was written."""

    topic: str
    partition: int
    offset: int


@dataclass(frozen=True, slots=True)
class _Outgoing:
    """An event queued in the producer and not yet reported on (kept to name it on failure)."""

    event_type: str
    topic: str
    key: str
    event: Mapping[str, Any]

    def unacknowledged(self, index: int, error: str | None) -> UnacknowledgedEvent:
        event_id = self.event.get("event_id")
        return UnacknowledgedEvent(
            index,
            self.event_type,
            self.topic,
            self.key,
            None if event_id is None else str(event_id),
            error,
            self.event,
        )


def _topic_for(event_type: str, topics: Iterable[TopicSpec]) -> TopicSpec:
    specs = list(topics)
    for spec in specs:
        if event_type in spec.event_types:
            return spec
    known = ", ".join(sorted(s.name for s in specs)) or "none"
    msg = (
        f"no topic carries {event_type!r} (topics known here: {known}). Operator action: add "
        f"{event_type!r} to the event_types of a TopicSpec in your package's contract set (the "
        "one its `refold.contracts` entry point names; `refold contracts check` lists them), or "
        "pass the publisher the topics that carry it."
    )
    raise UnknownEventTypeError(msg)


class EventPublisher:
    """Publishes domain events to their topics. One per process; not fork-safe.

    The Kafka producer is created on first use (no network in ``__init__``). Calls are not
    meant to run concurrently from several threads: a call that times out purges the whole
    producer queue, including another call's events (which that call then reports as
    unacknowledged).

    Args:
        kafka: Broker settings.
        codec: Contract codec; default the shipped schemas.
        topics: Topic specs; default every topic of the installed contract sets
            (:mod:`refold.contracts.registry`).
        gate: Which schema versions may be written; default the locks of the installed
            contract sets (:mod:`contracts.lock`). An event type whose newest version is not
            published (not in its ``contracts.lock``) or is refused is not sent.
        allow_unlocked: Development only: also write new compatible versions not locked yet.
        who: What it publishes for, in the line that says once per process what its producer
            uses (acks, idempotence, delivery timeout: :mod:`refold.contracts.kafka.delivery`).

    Raises:
        SchemaLockError: A published schema version was changed or deleted (default codec).
        SchemaIncompatibleError: A new schema version breaks BACKWARD_TRANSITIVE (default codec).
    """

    def __init__(
        self,
        kafka: KafkaSettings,
        codec: EventCodec | None = None,
        topics: Iterable[TopicSpec] | None = None,
        *,
        gate: PublishGate | None = None,
        allow_unlocked: bool = False,
        who: str = _WHO,
    ) -> None:
        self._who = who
        self._config: dict[str, Any] = {
            **_PRODUCER_DEFAULTS,
            **kafka.as_librdkafka(),
            "error_cb": self._on_client_error,
        }
        self._codec = codec or EventCodec()
        self._topics = list(default_registry().topics.values() if topics is None else topics)
        self._gate = default_publish_gate() if gate is None else gate
        self._allow_unlocked = allow_unlocked
        self._cleared: set[str] = set()  # event types whose newest version the gate let through
        self._producer: Producer | None = None
        # The latest client-level error (e.g. connection refused) and when (monotonic) it came.
        self._client_error: tuple[float, str] | None = None
        self._refused = False  # the latest client error is Kafka refusing the login

    @property
    def producer(self) -> Producer:
        """The underlying confluent-kafka producer (created lazily)."""
        if self._producer is None:
            config = durable(self._config, self._who)
            announce(self._who, config)
            self._producer = Producer(routed(config))
        return self._producer

    def _on_client_error(self, err: KafkaError) -> None:
        # Served from poll/flush in the calling thread. librdkafka retries these itself
        # (reconnects), so they are reported, not raised; a call that then times out names
        # the latest one.
        self._client_error = (time.monotonic(), err.str())
        self._refused = is_refusal(err)
        logger.warning("Kafka client error: %s", err.str())

    def _prepare(
        self, event_type: str, event: dict[str, Any], *, validated: bool = False
    ) -> tuple[str, bytes, bytes]:
        spec = self._check_type(event_type)
        if not validated:
            self._codec.validate(event_type, event)
        framing = self._framing(spec)
        value = self._codec.encode(event_type, event, validated=True, framing=framing)
        return spec.name, str(event[spec.key_field]).encode(), value

    def _framing(self, spec: TopicSpec) -> Framing:
        """The topic's framing: its spec's, else its contract set's (the registry's answer)."""
        return spec.framing or default_registry().framing(spec.name)

    def _check_type(self, event_type: str) -> TopicSpec:
        spec = _topic_for(event_type, self._topics)
        if event_type not in self._cleared:  # once per type: its newest version is publishable
            latest = self._codec.catalog.latest(event_type)
            self._gate.check(latest, allow_unlocked=self._allow_unlocked)
            # registry framing: its id, or SchemaNotRegisteredError saying what to run
            self._codec.header(latest, self._framing(spec))
            self._cleared.add(event_type)
        return spec

    def check(
        self, events: Iterable[tuple[str, dict[str, Any]]]
    ) -> list[tuple[int, ContractError]]:
        """Check every event as :meth:`emit_many` would, without sending anything.

        Returns:
            ``(index, error)`` for each event that would be refused (unknown type, schema
            version not published, or a contract violation naming every wrong field); empty
            when all would be accepted.
        """
        refused: list[tuple[int, ContractError]] = []
        limit = int(self._config.get("message.max.bytes", _MESSAGE_MAX_BYTES))
        for index, (event_type, event) in enumerate(events):
            try:
                self._check_type(event_type)
                self._codec.validate(event_type, event)
                self._check_size(event_type, event, limit)
            except ContractError as exc:
                refused.append((index, exc))
        return refused

    def _check_size(self, event_type: str, event: dict[str, Any], limit: int) -> None:
        """Refuse an event the producer would refuse (MSG_SIZE_TOO_LARGE) mid-call.

        Its Avro encoding is at most about twice its JSON size (no field names; a double is 8
        bytes against at least 3 characters), so only events whose JSON is over a third of the
        limit are encoded to be measured.
        """
        if len(orjson.dumps(event, default=str)) * 3 < limit:
            return
        size = len(self._codec.encode(event_type, event, validated=True))  # +-5 B by framing
        if size > limit:
            msg = (
                f"{event_type} event is {size} bytes encoded, over the producer's limit of "
                f"{limit} (message.max.bytes); nothing was sent"
            )
            raise EventTooLargeError(msg)

    def emit(self, event_type: str, event: dict[str, Any], timeout: float = 30.0) -> DeliveryToken:
        """Validate, publish one event and wait for the broker's acknowledgement.

        Raises:
            EventValidationError: The event breaks its contract (the message names the field);
                nothing was sent.
            SchemaUnlockedError: Its type's newest schema version is not published (not in
                its contract set's lock); nothing was sent. Also SchemaLockError or
                SchemaIncompatibleError when the gate refuses its schema family.
            PublishError: The broker did not acknowledge it within ``timeout``; it was purged
                from the producer and may or may not have been written (see PublishError).
        """
        return self.emit_many([(event_type, event)], timeout=timeout)[0]

    def emit_many(
        self,
        events: Iterable[tuple[str, dict[str, Any]]],
        timeout: float = 60.0,
        on_progress: Callable[[int], None] | None = None,
        *,
        validated: bool = False,
    ) -> list[DeliveryToken]:
        """Validate and publish many events, then wait until every one is acknowledged.

        Every event is validated before it is queued, so an invalid event stops the call before
        anything after it is sent; events before it may already be on their way.

        When the broker does not acknowledge everything within ``timeout`` (unreachable,
        hanging, refusing), the call purges what is still queued or in flight, so that this
        producer never delivers it later, and raises :class:`PublishError`. The error's
        ``unacknowledged`` lists those events; the others of the call were written.

        Args:
            events: ``(event_type, event)`` pairs.
            timeout: Seconds to wait for the acknowledgements once the last event is queued;
                also the longest wait for room while the local queue is full.
            on_progress: Called with the number of events queued since the previous call.
            validated: The caller has just had every event accepted by :meth:`check`
                (skips validating each one again).

        Returns:
            One token per event, in input order.

        Raises:
            EventValidationError: An event breaks its contract.
            SchemaUnlockedError: An event's newest schema version is not published; like an
                invalid event, it stops the call before it is queued (see :meth:`emit`).
            PublishError: Some events were not acknowledged; the message counts them, names the
                first few (index, type, topic, key, event_id, librdkafka's error) and says
                whether the client reported an error meanwhile.
        """
        producer = self.producer
        started = time.monotonic()
        tokens: list[DeliveryToken | None] = []
        outgoing: dict[int, _Outgoing] = {}
        failed: list[UnacknowledgedEvent] = []

        def _callback(index: int) -> Callable[[KafkaError | None, Message], None]:
            def _delivered(err: KafkaError | None, msg: Message) -> None:
                sent = outgoing.pop(index)
                if err is not None:
                    failed.append(sent.unacknowledged(index, err.str()))
                    return
                topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
                if topic is None or partition is None or offset is None:
                    failed.append(sent.unacknowledged(index, "delivery report without a position"))
                    return
                tokens[index] = DeliveryToken(topic, partition, offset)

            return _delivered

        queued = 0
        not_queued: UnacknowledgedEvent | None = None
        for index, (event_type, event) in enumerate(events):
            topic, key, value = self._prepare(event_type, event, validated=validated)
            tokens.append(None)
            sent = _Outgoing(event_type, topic, key.decode(), event)
            if not self._produce(producer, topic, key, value, _callback(index), timeout):
                # The local queue stayed full for `timeout`: the broker is not taking events.
                not_queued = sent.unacknowledged(index, f"not queued: local queue full {timeout}s")
                break
            outgoing[index] = sent
            queued += 1
            if queued % 1000 == 0:
                producer.poll(0)
                if on_progress is not None:
                    on_progress(1000)
        remaining = producer.flush(0 if not_queued is not None else timeout)
        if on_progress is not None and queued % 1000:
            on_progress(queued % 1000)
        if remaining:
            # Drop what the broker has not acknowledged, so that it cannot be delivered after
            # we reported it as failed; the purge makes its delivery reports fire (with
            # _PURGE_QUEUE or _PURGE_INFLIGHT), which `flush` then serves.
            producer.purge(in_queue=True, in_flight=True)
            producer.flush(_PURGE_DRAIN_S)
        if not (failed or outgoing or not_queued):
            return [t for t in tokens if t is not None]
        # After a purge or a message timeout librdkafka bumps the idempotent producer's epoch
        # itself and restarts its sequence numbers. Kafka accepts that (Tansu, the broker
        # refold started on, fenced the producer), but a fresh producer after a failure is
        # also the simplest state to reason about: a new producer id with empty sequences, for
        # one InitProducerId. Nothing is lost: the queue is empty (flushed or purged).
        if self._producer is producer:
            self._producer = None
        # A delivery report that never came (only if the client is wedged) counts as failed.
        failed.extend(sent.unacknowledged(i, "no delivery report") for i, sent in outgoing.items())
        if not_queued is not None:
            failed.append(not_queued)
        failed.sort(key=lambda u: u.index)
        msg = self._failure_message(failed, len(tokens), not_queued is not None, timeout, started)
        if remaining:
            msg += " Those still pending were purged and will not be delivered later."
        msg += (
            " An unacknowledged event may or may not have been written, so a retry can "
            "duplicate it. Operator action: check the errors above and that the brokers in "
            "bootstrap.servers are up and reachable."
        )
        delivered = [None if t is None else (t.topic, t.partition, t.offset) for t in tokens]
        raise PublishError(msg, failed, delivered)

    def _failure_message(
        self,
        failed: list[UnacknowledgedEvent],
        total: int,
        stopped_early: bool,
        timeout: float,
        started: float,
    ) -> str:
        named = "; ".join(u.describe() for u in failed[:_NAMED_IN_MESSAGE])
        more = len(failed) - _NAMED_IN_MESSAGE
        if more > 0:
            named += f"; and {more} more (see .unacknowledged)"
        of = f"{total}+ (input not read to its end)" if stopped_early else str(total)
        msg = f"{len(failed)} of {of} events not acknowledged within {timeout:g}s: {named}."
        if self._client_error is not None:
            # librdkafka does not repeat an unchanged error, so the latest may predate the call.
            at, error = self._client_error
            when = "during the call" if at >= started else f"{started - at:.0f}s before the call"
            msg += f" The Kafka client's latest error ({when}): {error}."
            if self._refused:
                msg = f"{refused('the producer', self._config, error)} {msg}"
        return msg

    @staticmethod
    def _produce(
        producer: Producer,
        topic: str,
        key: bytes,
        value: bytes,
        on_delivery: Callable[[KafkaError | None, Message], None],
        timeout: float,
    ) -> bool:
        """Queue one message, waiting up to ``timeout`` for room; False if there was none."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                producer.produce(topic, value, key, on_delivery=on_delivery)
                return True
            except BufferError:
                if time.monotonic() > deadline:
                    return False
                producer.poll(0.05)  # local queue full: let deliveries drain

    def close(self, timeout: float = 30.0) -> None:
        """Flush what is queued and drop the producer.

        Raises:
            PublishError: Messages were still unacknowledged after ``timeout``; they were
                purged. Only a call that did not wait for its events leaves any (an
                ``emit_many`` stopped by an invalid event, or interrupted).
        """
        if self._producer is None:
            return
        producer, self._producer = self._producer, None
        remaining = producer.flush(timeout)
        if remaining:
            producer.purge(in_queue=True, in_flight=True)
            producer.flush(_PURGE_DRAIN_S)
            msg = (
                f"{remaining} events queued by an earlier call were not acknowledged within "
                f"{timeout:g}s and were purged; each may or may not have been written."
            )
            raise PublishError(msg)
