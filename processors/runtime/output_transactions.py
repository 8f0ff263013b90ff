"""A batch's outputs in Kafka transactions, committed before its Redis transaction: exactly once.

A fold writer's outputs (side effects, dead letters, the late side output) are caused by source
records. They are collected in an :class:`Outbox` while the batch folds, then
:meth:`OutputTransactions.send` writes them to Kafka in one transaction that also commits, as
the consumer-group offsets of a *marker group*, how far each source partition's outputs are
written (the batch's new positions). Only then does the writer commit its Redis transaction.

Two commits, each atomic, in that order; what a crash between them leaves is repaired:

- a crash before the Kafka commit: the open transaction is aborted by the broker after
  ``transaction.timeout.ms`` (60 s); a ``read_committed`` consumer never sees its records (it
  waits for them until then); the batch is folded and sent again.
- a crash after the Kafka commit, before the Redis one: the marker is ahead of Redis' applied
  position. The batch is folded again (the fold is deterministic, DESIGN.md decision 9), and
  the outputs of the records below the marker are dropped: they are in the log already. The
  markers are read at every batch that has outputs (a few ms), because any worker may have
  committed some since.

After a transaction's outputs come its **watermark markers** (:mod:`refold.contracts.watermarks`):
for each output stream with an event-time field that the outputs went to, one record with no
key and no value on *every* partition of that topic, saying how far in event time each source
stream of the transaction has come. In the same transaction, so a ``read_committed`` consumer
sees a marker exactly when it sees what it speaks for (docs/event-time.md, "Across chains").

One ``transactional.id`` per writer (a Python worker's, for one generation): Spark runs a
partition's batches in whichever worker is free, so an id per partition would have the workers
fence each other at every other batch. A zombie writer's outputs (a task still running after it
was given up) may be a second copy with the same origin id, which refold's readers skip
(contracts/origin.py).

Each writer adds its id to the generation's ``writers`` set in Redis before its first
transaction, and a processor that takes the generation's lease fences them all
(:func:`fence_writers`): a new producer with each id aborts what the crashed holder left open
at once. Without it, the batch folded again waited for the broker's ``transaction.timeout.ms``
(60 s) to read the markers, and so did every ``read_committed`` consumer of the output topics.

The marker group is ``refold.outputs.<key prefix>.<processor>.g<N>.t<created at>[.s<slot>]``. It
never has members; Kafka keeps its offsets while it is committed to (offsets.retention.minutes,
7 days by default, after its last commit).

Live client code; not picklable: built lazily where the writer applies (an executor process).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar, cast

import redis
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from refold.contracts.kafka.consumers import passive_consumer_config
from refold.contracts.kafka.logs import routed
from refold.contracts.kafka.outputs import DeadLetterError, output_producer
from refold.contracts.origin import Headers
from refold.contracts.watermarks import Marker, marker_headers

__all__ = ["Outbox", "OutputTransactions", "fence_writers", "marker_group"]

logger = logging.getLogger(__name__)

SourceTP = tuple[str, int]
_T = TypeVar("_T")
# The broker may be away for a while (the acks wait up to 310 s the same way): each call waits.
_TXN_TIMEOUT_S, _STEP_S = 310.0, 10.0
# A call still running this long after its own timeout is stuck (see _bounded).
_GRACE_S = 5.0
# A transaction's errors when a newer producer with its transactional.id fenced it (after
# fence_writers): the writer starts a new producer, once per send. A produce() after the fencing
# says only _FATAL (the producer's fatal error, which is the fencing).
_FENCED = frozenset(
    {
        KafkaError._FENCED,  # noqa: SLF001 - librdkafka's public error names start with _
        KafkaError._FATAL,  # noqa: SLF001
        KafkaError.PRODUCER_FENCED,
        KafkaError.INVALID_PRODUCER_EPOCH,
    }
)
# Errors of a marker read that pass: the coordinator moves or loads, or the call timed out.
_COORDINATOR_WAITS = frozenset(
    {
        KafkaError.NOT_COORDINATOR,
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
        KafkaError._TIMED_OUT,  # noqa: SLF001 - librdkafka's public error names start with _
    }
)
# Clients left behind after librdkafka wedged (see _bounded): never closed or collected, since
# closing a wedged client may block too. At most a few per broker restart.
_LEFT: list[object] = []


def marker_group(
    key_prefix: str, processor: str, generation: int, slot: int | None, created_at: str = ""
) -> str:
    """The consumer group whose offsets say how far a generation's outputs are committed.

    ``created_at`` (the generation's, from its registry meta) tells apart two generations that
    had the same number: gc frees the number of a generation it removes.
    """
    created = f".t{created_at}" if created_at else ""
    suffix = "" if slot is None else f".s{slot}"
    return f"refold.outputs.{key_prefix}.{processor}.g{generation}{created}{suffix}"


@dataclass(frozen=True, slots=True)
class _Output:
    source: SourceTP
    offset: int
    topic: str
    value: bytes | None
    key: bytes | None
    headers: Headers
    partition: int | None = None  # None: the producer's partitioner (by key)


@dataclass(slots=True)
class Outbox:
    """The outputs of one batch, in the order they are produced, with their source record.

    ``times``: per output stream topic with markers, per source stream, the largest event time
    among its outputs (:meth:`mark`).
    """

    outputs: list[_Output] = field(default_factory=list)
    times: dict[str, dict[str, int]] = field(default_factory=dict)

    def mark(self, topic: str, stream: str, at: int) -> None:
        """An output of ``stream`` on ``topic`` has event time ``at`` (for the markers)."""
        streams = self.times.setdefault(topic, {})
        if at > streams.get(stream, at - 1):
            streams[stream] = at

    def markers(self, partitions: Callable[[str], int], streams: int) -> list[_Output]:
        """The watermark markers: to every partition of each topic in :attr:`times`.

        Args:
            partitions: The partition count of a topic (as it is on the broker).
            streams: How many streams the producer has in all (the markers' ``of``).
        """
        out: list[_Output] = []
        for topic, times in sorted(self.times.items()):
            headers = cast("Headers", marker_headers(Marker(times, max(streams, len(times)))))
            out.extend(
                _Output(("", -1), -1, topic, None, None, headers, p)
                for p in range(partitions(topic))
            )
        return out

    def add(
        self,
        source: tuple[str, int, int],
        topic: str,
        value: bytes | None,
        key: bytes | None,
        headers: Headers,
    ) -> None:
        """Queue one output of the source record ``(topic, partition, offset)``."""
        self.outputs.append(_Output((source[0], source[1]), source[2], topic, value, key, headers))

    def __len__(self) -> int:
        return len(self.outputs)


class _StuckError(Exception):
    """A transactional call of librdkafka did not return after its timeout (see _bounded)."""


class _FencedError(Exception):
    """A newer producer with the writer's transactional.id fenced its producer."""


def _bounded(call: Callable[[float], _T], timeout: float) -> _T:
    """``call(timeout)`` on a helper thread; :class:`_StuckError` when it outlives the timeout.

    librdkafka 2.x may block a transactional call for good, whatever its timeout, after the
    broker it cached as the group coordinator went away (confluentinc/librdkafka#5456, #5511:
    a restarted broker left send_offsets_to_transaction waiting for ever, and the processor
    with it). A C call cannot be interrupted: the caller leaves the thread blocked (it holds no
    lock and no GIL) and replaces the producer (OutputTransactions.send).
    """
    outcome: list[tuple[_T | None, BaseException | None]] = []

    def _run() -> None:
        try:
            outcome.append((call(timeout), None))
        except BaseException as exc:  # handed to the caller's thread as is
            outcome.append((None, exc))

    worker = threading.Thread(target=_run, name="refold-output-transaction", daemon=True)
    worker.start()
    worker.join(timeout + _GRACE_S)
    if not outcome:
        msg = f"no return {timeout + _GRACE_S:.0f}s after a call with a {timeout:.0f}s timeout"
        raise _StuckError(msg)
    value, error = outcome[0]
    if error is not None:
        raise error
    return cast("_T", value)


def _waiting(what: str, call: Callable[[float], object]) -> None:
    """``call(timeout)``, again after each retriable error (a timeout: the broker is away).

    librdkafka says a timed-out init, offsets send or commit may be called again; it logs every
    _STEP_S and gives up after _TXN_TIMEOUT_S (nothing after it is committed then).

    Raises:
        _StuckError: The call did not return at all (:func:`_bounded`).
    """
    waited = 0.0
    while True:
        try:
            _bounded(call, _STEP_S)
            return
        except KafkaException as exc:
            error = exc.args[0]
            if not error.retriable() or waited >= _TXN_TIMEOUT_S:
                raise
            waited += _STEP_S
            logger.warning("%s waits for the broker (%.0fs): %s", what, waited, error.str())


def _produce(producer: Producer, output: _Output) -> None:
    """Queue one record of a transaction; commit_transaction waits for every acknowledgement.

    No delivery callback: the commit fails when a record failed, and a fenced producer raises
    at its next produce (a callback served then would run with that exception set).
    """
    while True:
        try:
            if output.partition is None:
                producer.produce(output.topic, output.value, output.key, headers=output.headers)
            else:
                producer.produce(
                    output.topic,
                    output.value,
                    output.key,
                    partition=output.partition,
                    headers=output.headers,
                )
        except BufferError:  # the local queue is full: let it drain
            producer.poll(0.1)
            continue
        return


class OutputTransactions:
    """Sends a writer's outboxes in Kafka transactions, with the markers that make them once.

    Args:
        kafka: librdkafka settings (bootstrap servers, security).
        group: The marker group (:func:`marker_group`).
        register: Called with the transactional.id before each new producer starts (the
            generation's ``writers`` set, which :func:`fence_writers` reads).
        floor: Per source partition, how far the processor's other generations have
            committed outputs (their marker groups, read when the query started:
            :func:`~refold.processors.runtime.sent_outputs.committed_floor`): the outputs of
            records below it are not sent again, as if this group's markers said so.
        exempt: Topics the floor does not apply to (the dead-letter and late topics: their
            letters are once per reason, through the ``dl:sent`` ledger).
    """

    def __init__(
        self,
        kafka: Mapping[str, str],
        group: str,
        register: Callable[[str], object] | None = None,
        floor: Mapping[SourceTP, int] | None = None,
        exempt: frozenset[str] = frozenset(),
    ) -> None:
        self.kafka = dict(kafka)
        self.group = group
        self.floor = dict(floor or {})
        self.exempt = exempt
        self.transactional_id = f"{group}.{uuid.uuid4().hex[:12]}"
        self._register = register
        self._producer: Producer | None = None
        self._consumer: Consumer | None = None
        self._partitions: dict[str, int] = {}

    def _transactional(self) -> Producer:
        if self._producer is None:
            if self._register is not None:  # again with each new producer: fence_writers
                self._register(self.transactional_id)  # removes the ids it fenced
            producer = output_producer({**self.kafka, "transactional.id": self.transactional_id})
            _waiting(f"starting {self.transactional_id}", producer.init_transactions)
            self._producer = producer
        return self._producer

    def partitions(self, topic: str) -> int:
        """How many partitions ``topic`` has on the broker (asked once per writer and topic).

        Raises:
            DeadLetterError: The broker did not say (the batch is folded again).
        """
        count = self._partitions.get(topic)
        if count is None:
            try:
                found = self._transactional().list_topics(topic, timeout=_STEP_S).topics[topic]
            except (KafkaException, KeyError) as exc:
                msg = f"the partitions of {topic} are unknown: {exc}"
                raise DeadLetterError(msg) from exc
            if found.error is not None or not found.partitions:
                msg = f"the partitions of {topic} are unknown: {found.error}"
                raise DeadLetterError(msg)
            count = self._partitions[topic] = len(found.partitions)
        return count

    def marks(self, tps: list[SourceTP]) -> dict[SourceTP, int]:
        """How far each source partition's outputs are committed (0: none yet).

        Waits while another writer's transaction holds offsets of the group open (until it
        commits, or the broker aborts it).
        """
        deadline = time.monotonic() + _TXN_TIMEOUT_S
        wanted = [TopicPartition(t, p) for t, p in tps]
        while True:
            consumer = self._group_consumer()
            try:
                found = _bounded(functools.partial(consumer.committed, wanted), _STEP_S)
            except (KafkaException, _StuckError) as exc:
                # The group's coordinator moves or loads (a broker that just started), an open
                # transaction holds the offsets (librdkafka retries until the timeout), or this
                # client kept a coordinator that is gone (librdkafka#5511): a new client asks
                # for the coordinator again.
                error = exc.args[0] if isinstance(exc, KafkaException) else None
                waits = error is None or error.code() in _COORDINATOR_WAITS
                if not waits or time.monotonic() > deadline:
                    msg = f"reading the output markers of {self.group} failed: {exc}"
                    raise DeadLetterError(msg) from exc
                _LEFT.append(consumer)
                self._consumer = None
                time.sleep(0.2)
                continue
            return {(tp.topic, tp.partition): max(0, tp.offset) for tp in found}

    def send(
        self, outbox: Outbox, ends: Mapping[SourceTP, int], markers: Sequence[_Output] = ()
    ) -> int:
        """Commit the outbox's outputs not committed yet, with ``ends`` as the new markers.

        Args:
            outbox: The batch's outputs.
            ends: Per source partition with outputs, the batch's new position (exclusive).
            markers: Watermark markers (:meth:`Outbox.markers`), sent after the outputs when
                any of them is sent.

        Returns:
            How many outputs were dropped because an earlier run committed them.

        Raises:
            DeadLetterError: Kafka did not take the transaction (nothing of it is visible to
                a read_committed consumer; the batch is not committed and is folded again).
        """
        if not outbox.outputs:
            return 0
        deadline = time.monotonic() + _TXN_TIMEOUT_S
        fenced = False
        while True:
            marks = self.marks(sorted({o.source for o in outbox.outputs}))
            outputs = [o for o in outbox.outputs if o.offset >= marks[o.source]]
            dropped = len(outbox.outputs) - len(outputs)
            if dropped:
                logger.info(
                    "%d outputs of %s were committed by an earlier run (crashed before its "
                    "Redis commit): not sent again",
                    dropped,
                    self.group,
                )
            if self.floor:
                kept = [o for o in outputs if not self._below_floor(o)]
                if len(kept) < len(outputs):
                    logger.info(
                        "%d outputs of %s were committed by another generation of the "
                        "processor (its marker groups): not sent again",
                        len(outputs) - len(kept),
                        self.group,
                    )
                dropped += len(outputs) - len(kept)
                outputs = kept
            if not outputs:
                return dropped
            try:
                self._commit([*outputs, *markers], ends)
            except _FencedError as exc:
                # A processor that took the generation's lease fenced this writer's last
                # producer: nothing of the transaction is visible; a new producer sends it.
                if fenced:
                    msg = f"the outputs of {self.transactional_id} were not committed: {exc}"
                    raise DeadLetterError(msg) from exc
                fenced = True
                logger.info("%s: %s; starting a new producer", self.transactional_id, exc)
                continue
            except _StuckError as exc:
                # The stuck producer is left as it is: the next one, with the same
                # transactional.id, fences it and aborts its open transaction (or completes
                # it, if it was committing: the markers read again then drop its outputs).
                _LEFT.append(self._producer)
                self._producer = None
                if time.monotonic() > deadline:
                    msg = f"the outputs of {self.transactional_id} were not committed: {exc}"
                    raise DeadLetterError(msg) from exc
                logger.warning(
                    "%s: %s; sending the batch's outputs again with a new producer",
                    self.transactional_id,
                    exc,
                )
                continue
            return dropped

    def _below_floor(self, output: _Output) -> bool:
        """True for an output another generation committed (:attr:`floor`)."""
        if output.topic in self.exempt:
            return False
        return output.offset < self.floor.get(output.source, 0)

    def _commit(self, outputs: list[_Output], ends: Mapping[SourceTP, int]) -> None:
        sources = sorted({o.source for o in outputs if o.partition is None})
        what = f"{len(outputs)} outputs of {self.transactional_id}"
        try:
            producer = self._transactional()
            producer.begin_transaction()
            for output in outputs:
                _produce(producer, output)
            offsets = [TopicPartition(t, p, ends[t, p]) for t, p in sources]
            metadata = self._group_consumer().consumer_group_metadata()
            _waiting(
                f"the markers of {what}",
                lambda timeout: producer.send_offsets_to_transaction(offsets, metadata, timeout),
            )
            _waiting(f"committing {what}", producer.commit_transaction)
        except KafkaException as exc:
            self._abandon()
            if exc.args[0].code() in _FENCED:
                raise _FencedError(exc.args[0].str()) from exc
            msg = f"the transaction of {what} failed: {exc}"
            raise DeadLetterError(msg) from exc

    def _abandon(self) -> None:
        """After a failure: abort what is open, and start a new producer next time."""
        producer, self._producer = self._producer, None
        if producer is not None:
            try:
                producer.abort_transaction(10)
            except KafkaException:
                logger.debug("abort of %s failed; the broker aborts it", self.transactional_id)

    def _group_consumer(self) -> Consumer:
        """A client of the marker group: it reads the markers and never joins the group."""
        if self._consumer is None:
            # It reads committed() and lends its group metadata to the transactions, which
            # commit the markers (send_offsets_to_transaction); it never commits itself.
            # read_committed makes committed() ask for stable offsets (it waits out a
            # transaction in flight).
            config = passive_consumer_config(self.kafka, self.group, isolation="read_committed")
            self._consumer = Consumer(
                routed(
                    {
                        **config,
                        # Right after a transaction commits, its offsets are unstable for a
                        # few ms (until the markers are written): the default 100 ms backoff
                        # made a marker read ~110 ms, 10 ms makes it ~11 ms. Applied after the
                        # user's settings, as before: a marker read must stay this fast.
                        "retry.backoff.ms": 10,
                        "retry.backoff.max.ms": 50,
                    }
                )
            )
        return self._consumer

    def close(self) -> None:
        """Close the clients (an open transaction is aborted by the next writer)."""
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
        self._producer = None


def fence_writers(kafka: Mapping[str, str], client: redis.Redis, key: str) -> int:
    """Fence every writer in the ``writers`` set ``key``: what they left open is aborted now.

    Called by a processor that takes a generation's lease, before its query starts: the writers
    in the set ran under an earlier holder (a process that crashed, stopped or lost the lease,
    or this process's last query). A producer that initialises each transactional.id makes the
    broker abort that id's open transaction at once, instead of after ``transaction.timeout.ms``
    (60 s). A fenced writer that is still alive (a worker this process reuses) starts a new
    producer at its next transaction, and adds its id again. When the broker does not answer,
    the ids left stay in the set (the broker aborts their transactions in time anyway).

    Returns:
        How many writers were fenced.
    """
    fenced = 0
    for raw in sorted(client.smembers(key)):
        transactional_id = raw.decode() if isinstance(raw, bytes) else str(raw)
        producer = output_producer({**kafka, "transactional.id": transactional_id})
        try:
            _bounded(producer.init_transactions, _STEP_S)
        except (KafkaException, _StuckError) as exc:
            logger.warning(
                "%s was not fenced (its open transaction times out): %s", transactional_id, exc
            )
            if isinstance(exc, _StuckError):
                _LEFT.append(producer)
            break
        client.srem(key, raw)
        fenced += 1
    return fenced
