"""The webhook dispatcher: insight topics -> HTTP POST, at least once, positions in Redis.

One loop, interleaving three things: read records from the assigned partitions (no consumer
group: positions live in Redis) while fewer than ``max_uncommitted`` are in progress; attempt them
(``concurrency`` requests in flight; an insight waiting for a retry holds no thread, see
:mod:`refold.services.webhooks.scheduling`); and commit each partition's settled prefix: dead
letters first (acknowledged by the broker), then in Redis the next offset per partition, a log entry
per insight and the counters, in one call. A crash re-delivers at most the uncommitted records, with
the same ``Idempotency-Key``s.

A stop (:meth:`WebhookDispatcher.stop`, SIGTERM in the CLI) interrupts the backoffs, lets the
requests in flight finish, and commits the longest delivered-or-dead-lettered prefix of each
partition; the rest is delivered again by the next run.

``redrive`` is the same loop over the dispatcher's dead-letter topic, up to its end at start:
each dead letter is delivered again with its original key; what fails again is appended to the
dead-letter topic once more (for a later redrive).

Lifecycle: one dispatcher per thread; :meth:`WebhookDispatcher.run` blocks until stopped (or,
with ``until_end``, until the topics' ends at start are delivered);
:meth:`WebhookDispatcher.start` runs it in a background thread
(:class:`~refold.services.webhooks.thread.DispatcherThread`). Where it reads and the copy of
its positions in Kafka: :mod:`refold.services.webhooks.positions`.
"""

from __future__ import annotations

import logging
import ssl
import threading
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Literal

import httpx
import redis
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from refold.contracts.codec import EventCodec
from refold.contracts.errors import RefoldError
from refold.contracts.kafka.admin import ensure_topics
from refold.contracts.kafka.outputs import DeadLetterError, Deliveries, output_producer
from refold.contracts.service_keys import WebhookKeys
from refold.contracts.store.credentials import raise_if_refused
from refold.contracts.topics import dead_letter_spec
from refold.services.webhooks.config import WebhookSettings, mirror_group
from refold.services.webhooks.delivery import AttemptResult, RetryPolicy, WebhookSender
from refold.services.webhooks.errors import (
    WebhookConfigError,
    WebhookDeadLetterError,
    WebhookLeaseError,
    WebhookStoreError,
)
from refold.services.webhooks.items import DeliveryItem, dead_letter_headers, item_from_message
from refold.services.webhooks.positions import (
    TP,
    caught_up,
    dispatcher_consumer,
    lag,
    mirror_positions,
    start_positions,
)
from refold.services.webhooks.scheduling import (
    AttemptScheduler,
    ProgressReport,
    UncommittedWindow,
)
from refold.services.webhooks.store import DispatcherLease, LogEntry, WebhookStore
from refold.services.webhooks.thread import DispatcherThread

__all__ = ["DispatcherStats", "Role", "WebhookDispatcher"]

logger = logging.getLogger(__name__)

Role = Literal["dispatch", "redrive"]
_PROGRESS_S = 10.0  # progress log period (a line only when something was settled meanwhile)
_SCHEDULER_TICK_S = 0.2  # longest wait for answers when no new record could be read anyway
_STEP_S = 0.05  # longest wait for answers while there is room to read new records
_COMMIT_INTERVAL_S = 0.5  # commit settled records at least this often (log and positions)
_LEASE_WAIT_S = 30.0


@dataclass(slots=True)
class DispatcherStats:
    """In-process counters of one dispatcher run (Redis keeps the persistent ones)."""

    delivered: int = 0
    retried: int = 0
    failed: int = 0
    skipped: int = 0
    commits: int = 0
    committed: dict[TP, int] = field(default_factory=dict)


class WebhookDispatcher:
    """Delivers the records of insight topics (or of its dead-letter topic) to one URL.

    Args:
        settings: What to deliver where, and how hard to try.
        kafka: librdkafka settings (at least ``bootstrap.servers``).
        redis_client: A redis-py client (bytes responses).
        key_prefix: Prefix of refold's Redis keys.
        role: ``dispatch`` (the insight topics) or ``redrive`` (the dead-letter topic).
        until_end: Stop once everything up to the topics' ends at start is delivered or
            dead-lettered (always so for ``redrive``).
        codec: Decodes the records (default: every installed contract).
        transport: An httpx transport instead of the network (tests).
        stop_event: Stops :meth:`run` when set (shared with other components, e.g. a demo's);
            :meth:`stop` sets it. A dispatcher runs once.
    """

    def __init__(
        self,
        settings: WebhookSettings,
        kafka: Mapping[str, str],
        redis_client: redis.Redis,
        key_prefix: str,
        *,
        role: Role = "dispatch",
        until_end: bool = False,
        codec: EventCodec | None = None,
        transport: httpx.BaseTransport | None = None,
        stop_event: threading.Event | None = None,
    ) -> None:
        self.settings = settings
        self.kafka = dict(kafka)
        self.role: Role = role
        self.until_end = until_end or role == "redrive"
        self.keys = WebhookKeys(settings.name, key_prefix)
        self.group = mirror_group(settings.name, role, key_prefix)
        self.store = WebhookStore(redis_client, self.keys, settings.log_max_entries)
        self.policy = RetryPolicy(
            settings.max_attempts, settings.backoff_initial_s, settings.backoff_max_s
        )
        self.stats = DispatcherStats()
        self.ready = threading.Event()
        self._codec = codec
        self._transport = transport
        self._redis = redis_client
        self._stop = stop_event or threading.Event()
        self._producer: Producer | None = None
        self._settled = 0  # settled records in the uncommitted window
        self._topics = (settings.dlq_topic,) if role == "redrive" else settings.topics

    # -- lifecycle -------------------------------------------------------------------------

    def stop(self) -> None:
        """Ask :meth:`run` to stop: backoffs end, requests in flight finish, then it commits."""
        self._stop.set()

    def start(self) -> DispatcherThread:
        """Run in a background thread; :meth:`DispatcherThread.stop` stops it."""
        return DispatcherThread(self).start()

    def run(self) -> None:
        """Deliver until stopped (or, with ``until_end``, until caught up).

        Raises:
            WebhookConfigError: A topic does not exist, or the DLQ topic cannot be made.
            WebhookLeaseError: Another dispatcher of this name and role runs.
            WebhookDeadLetterError: The broker did not acknowledge dead letters.
            WebhookStoreError: Redis was unreachable for too long.
        """
        settings = self.settings
        if not self._topics:
            msg = f"{settings.name}: no insight topics to deliver (settings.topics is empty)"
            raise WebhookConfigError(msg)
        if not settings.is_loopback and settings.url.startswith("http://"):
            logger.warning("%s: delivering to %s in clear text", settings.name, settings.url)
        verify = self._tls_context()
        lease = self._acquire_lease()
        consumer: Consumer | None = None
        sender: WebhookSender | None = None
        pool: ThreadPoolExecutor | None = None
        try:
            self._ensure_dlq_topic()
            consumer = dispatcher_consumer(self.kafka, self.group)
            try:
                ends, positions = start_positions(
                    self.kafka,
                    self._topics,
                    self.store,
                    lease,
                    consumer,
                    name=settings.name,
                    from_end=settings.start == "end" and self.role == "dispatch",
                    until_end=self.until_end,
                )
            except redis.RedisError as exc:
                msg = f"{settings.name}: cannot read positions from Redis ({exc})"
                raise WebhookStoreError(msg) from exc
            consumer.assign([TopicPartition(t, p, o) for (t, p), o in sorted(positions.items())])
            sender = self._sender(verify)
            pool = ThreadPoolExecutor(settings.concurrency, thread_name_prefix="webhook")
            self._log_start(positions)
            self.stats.committed = dict(positions)
            self.ready.set()
            running_sender = sender
            scheduler = AttemptScheduler(
                pool,
                lambda item: self._attempt(running_sender, item),
                self._settle,
                settings.concurrency,
            )
            self._loop(consumer, scheduler, lease, ends)
        finally:
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)
            if sender is not None:
                sender.close()
            if consumer is not None:
                consumer.close()
            if self._producer is not None:  # every dead letter was acknowledged already
                self._producer.flush(5)
                self._producer = None
            lease.release()
            self.ready.set()  # a waiter must not hang on a dispatcher that failed to start

    # -- start ----------------------------------------------------------------------------

    def _tls_context(self) -> ssl.SSLContext | bool:
        try:
            return self.settings.tls_context()
        except OSError as exc:  # ssl.SSLError is one
            msg = (
                f"{self.settings.name}: cannot load the TLS files ({exc}). Operator action: "
                "check ca_bundle, client_cert and client_key."
            )
            raise WebhookConfigError(msg) from exc

    def _acquire_lease(self) -> DispatcherLease:
        lease = DispatcherLease(self._redis, self.keys, self.role)
        try:
            lease.acquire(_LEASE_WAIT_S)
        except redis.RedisError as exc:
            raise_if_refused(exc, f"the webhook dispatcher {self.settings.name}", self._redis)
            msg = (
                f"{self.settings.name}: Redis unreachable ({exc}). Operator action: check "
                "REFOLD_REDIS__URL."
            )
            raise WebhookStoreError(msg) from exc
        return lease

    def _sender(self, verify: ssl.SSLContext | bool) -> WebhookSender:
        settings = self.settings
        return WebhookSender(
            settings.url,
            timeout_s=settings.timeout_s,
            connect_timeout_s=settings.connect_timeout_s,
            connections=settings.concurrency,
            headers={k: v.get_secret_value() for k, v in settings.headers.items()},
            signing_secret=None
            if settings.signing_secret is None
            else settings.signing_secret.get_secret_value(),
            verify=verify,
            transport=self._transport,
        )

    def _log_start(self, positions: Mapping[TP, int]) -> None:
        logger.info(
            "%s (%s): delivering %s to %s from %s; retry budget %.0f-%.0f s over %d attempts",
            self.settings.name,
            self.role,
            ", ".join(self._topics),
            self.settings.url,
            ", ".join(f"{t}/{p}@{o}" for (t, p), o in sorted(positions.items())),
            *self.policy.budget_bounds(),
            self.settings.max_attempts,
        )

    def _ensure_dlq_topic(self) -> None:
        spec = dead_letter_spec(self.settings.name, self.settings.dlq_topic)
        try:
            ensure_topics(self.kafka, [spec])
        except (RefoldError, KafkaException) as exc:
            msg = (
                f"cannot create the dead-letter topic {spec.name}: {exc}. Operator action: "
                "check the broker (REFOLD_KAFKA__BOOTSTRAP_SERVERS)."
            )
            raise WebhookConfigError(msg) from exc

    # -- the loop -------------------------------------------------------------------------

    def _loop(
        self,
        consumer: Consumer,
        scheduler: AttemptScheduler,
        lease: DispatcherLease,
        ends: Mapping[TP, int],
    ) -> None:
        """Read, attempt and commit, interleaved, until stopped (or caught up)."""
        settings = self.settings
        window = UncommittedWindow()
        last_commit = last_unseen = time.monotonic()
        progress = ProgressReport(_PROGRESS_S, last_commit)
        while not self._stop.is_set():
            if lease.lost.is_set():
                msg = f"{settings.name}: lost the lease; another dispatcher took over"
                raise WebhookLeaseError(msg)
            if time.monotonic() - last_unseen >= _COMMIT_INTERVAL_S:
                self._commit_past_unseen(window, lease, consumer)
                last_unseen = time.monotonic()
            if self.until_end and not window.size and caught_up(self.stats.committed, ends):
                logger.info("%s (%s): caught up", settings.name, self.role)
                return
            room = settings.max_uncommitted - window.size
            # Read more when the scheduler runs low (not after every answer: a poll costs), and
            # without waiting while deliveries are under way.
            if room > 0 and scheduler.pending < settings.batch_size:
                wait_s = 0.0 if scheduler.busy else settings.poll_timeout_s
                for message in consumer.consume(min(settings.batch_size, room), wait_s):
                    item = self._item(message)
                    if item is not None:
                        window.add(item)
                        if item.final is None:
                            scheduler.add(item)
            if scheduler.busy:
                scheduler.step(_STEP_S if room > 0 else _SCHEDULER_TICK_S, self._stop)
            now = time.monotonic()
            if window.committable() and (
                not scheduler.busy
                or self._settled >= settings.batch_size
                or now - last_commit >= _COMMIT_INTERVAL_S
            ):
                self._commit(window, lease, consumer)
                last_commit = now
            stats = self.stats
            settled = stats.delivered + stats.retried + stats.failed + stats.skipped
            rate = progress.due(stats.delivered, settled, now)
            if rate is not None:
                logger.info(
                    "%s (%s): delivered %d (%.0f/s), retried %d, dead-lettered %d; %d in "
                    "progress, %d behind",
                    settings.name,
                    self.role,
                    self.stats.delivered,
                    rate,
                    self.stats.retried,
                    self.stats.failed,
                    scheduler.pending,
                    lag(consumer, self.stats.committed),
                )
        # Stopped: the attempts in flight finish; what was settled before the first unsettled
        # record of each partition is committed; the rest is delivered again by the next run.
        scheduler.drain()
        if window.committable():
            self._commit(window, lease, consumer)

    def _item(self, message: Message) -> DeliveryItem | None:
        error = message.error()
        if error is not None:
            if error.fatal():
                msg = f"the consumer failed: {error.str()}"
                raise WebhookConfigError(msg)
            if error.code() != KafkaError._MAX_POLL_EXCEEDED:  # noqa: SLF001 - public name
                logger.warning("%s: consumer: %s", self.settings.name, error.str())
            return None
        if self._codec is None:
            self._codec = EventCodec()
        item = item_from_message(message, self._codec, self.policy.new_state())
        severities = self.settings.severities
        if item.final is None and severities and item.severity not in (None, *severities):
            item.final = "skipped"  # not for this webhook (e.g. a non-critical insight)
        if item.final is not None:  # undecodable or skipped: settled at once
            self._settled += 1
        return item

    # -- settling and committing --------------------------------------------------------

    def _commit(
        self, window: UncommittedWindow, lease: DispatcherLease, consumer: Consumer
    ) -> None:
        """Dead-letter and commit every partition's settled prefix (positions, log, counters).

        Then copy the positions to the dispatcher's consumer group (:func:`mirror_positions`).
        """
        positions, settled = window.pop_settled()
        self._settled -= len(settled)
        failed = [i for i in settled if i.final == "failed"]
        if failed:
            self._dead_letter(failed)
        counts: Counter[str] = Counter()
        logged = [i for i in settled if i.final != "skipped"]
        for item in settled:
            if item.final == "skipped":
                counts["skipped"] += 1
            elif item.final == "delivered":
                counts["delivered"] += 1
                if self.role == "redrive":
                    counts["redriven"] += 1
            else:
                counts["failed"] += 1
                counts[f"failed:{item.reason}"] += 1
        self.store.commit(lease, positions, [self._entry(i) for i in logged], counts)
        mirror_positions(consumer, positions, self.settings.name)
        self.stats.delivered += counts["delivered"]
        self.stats.failed += counts["failed"]
        self.stats.skipped += counts["skipped"]
        self.stats.commits += 1
        self.stats.committed.update(positions)

    def _commit_past_unseen(
        self, window: UncommittedWindow, lease: DispatcherLease, consumer: Consumer
    ) -> None:
        """Move a position with nothing in flight past offsets no record is read from.

        Insights come out of Kafka transactions: each one ends with a commit marker, which
        takes an offset and is never handed to the application (nor are aborted records). The
        position after the last record read stays below the log end, so a partition would
        look one behind forever (``until_end`` would never end, lag never reach 0). The
        consumer's own position does move past them; with no record of the partition in
        flight, every offset below it is settled.
        """
        idle = [TopicPartition(t, p) for (t, p) in self.stats.committed if not window.holds((t, p))]
        moved = {
            (tp.topic, tp.partition): tp.offset
            for tp in consumer.position(idle)
            if tp.offset > self.stats.committed[tp.topic, tp.partition]
        }
        if moved:
            self.store.commit(lease, moved, [], {})
            mirror_positions(consumer, moved, self.settings.name)
            self.stats.committed.update(moved)

    def _attempt(self, sender: WebhookSender, item: DeliveryItem) -> AttemptResult:
        """One POST (in a worker thread); an unexpected error rejects the item, not the batch."""
        try:
            return sender.attempt(item.body, item.request_headers(self.settings.name), item.key)
        except Exception as exc:  # a bad record must not stop the stream (DESIGN.md 10)
            logger.exception("%s: attempt on %s failed", self.settings.name, item.key)
            return AttemptResult(None, f"{type(exc).__name__}: {exc}"[:500], False, None, 0.0)

    def _settle(self, item: DeliveryItem, result: AttemptResult) -> float | None:
        """Record an attempt; the delay before the next one, or None when the item is settled."""
        item.record(result)
        delay = self.policy.next_delay(item.state, result)
        if result.delivered:
            item.final = "delivered"
            self._settled += 1
        elif delay is None:
            item.final = "failed"
            self._settled += 1
            item.reason = "webhook-failed" if result.retriable else "webhook-rejected"
            logger.warning(
                "%s: %s -> dead-letter topic (%s, attempts: %d)",
                self.settings.name,
                item.key,
                result.describe(),
                item.attempts,
                extra={"topic": item.topic, "partition": item.partition, "offset": item.offset},
            )
        else:
            self.stats.retried += 1
            self.store.log_retry(self._entry(item, status="retry"))
        return delay

    def _entry(self, item: DeliveryItem, status: str | None = None) -> LogEntry:
        last = item.last
        return LogEntry(
            id=item.key,
            topic=item.topic,
            partition=item.partition,
            offset=item.offset,
            status=status or item.final or "",
            code=0 if last is None or last.status is None else last.status,
            attempts=item.attempts,
            latency_ms=0.0 if last is None else last.latency_ms,
            elapsed_ms=item.elapsed_ms(),
            time_ms=item.answered_at_ms or int(time.time() * 1000),
            reason=item.reason if status is None else "",
            error=item.error_text(),
            run=self.role,
        )

    def _dead_letter(self, failed: Sequence[DeliveryItem]) -> None:
        """Produce the failed items to the dead-letter topic and wait for every ack."""
        topic = self.settings.dlq_topic
        sent = Deliveries(self._dlq_producer(), f"{len(failed)} insights to {topic}")
        for item in failed:
            sent.produce(
                topic, item.value, item.kafka_key, dead_letter_headers(item, self.settings.name)
            )
        try:
            sent.wait()
        except DeadLetterError as exc:
            msg = (
                f"{exc}. The batch is not committed: a restart delivers it again. Operator "
                "action: check the broker (REFOLD_KAFKA__BOOTSTRAP_SERVERS), then restart."
            )
            raise WebhookDeadLetterError(msg) from exc

    def _dlq_producer(self) -> Producer:
        if self._producer is None:  # lazily: most runs dead-letter nothing
            self._producer = output_producer(self.kafka, "the webhook dispatcher's dead letters")
        return self._producer
