"""The API keys' journal: every key record on a compacted Kafka topic; Redis is its cache.

Keys cannot be derived from the domain log, so their records (id, name, scopes, times and the
SHA-256 of the key, never the key) also go to ``<key prefix>.api-keys``, keyed by key id,
compacted (the latest record per key stays). ``refold keys add`` journals a key before it
reports it (a key the broker did not acknowledge is taken back), ``revoke`` journals the
revocation, and a key store found empty (Redis restarted empty, or was flushed) is filled from
the journal by ``refold serve`` at start and by every ``refold keys`` command.

Restoring only fills an *empty* store (``HSETNX``): it never overwrites a record Redis has, so a
revocation written to Redis and not yet journaled is never undone by it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping

from confluent_kafka import KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from refold.contracts.errors import RefoldError
from refold.contracts.kafka.admin import ensure_topics
from refold.contracts.kafka.consumers import passive_consumer
from refold.contracts.kafka.offsets import LogOffsets
from refold.contracts.kafka.outputs import Deliveries, output_producer
from refold.contracts.topics import TopicSpec
from refold.services.auth.errors import ApiKeyStoreError
from refold.services.auth.keys import ApiKeyStore

__all__ = ["ApiKeyJournal", "journal_topic"]

logger = logging.getLogger(__name__)

# Reading the journal back: it holds one record per key ever made, a few thousand at most.
_READ_TIMEOUT_S = 30.0


def journal_topic(key_prefix: str) -> str:
    """``<key prefix>.api-keys``: the journal of the keys stored under ``key_prefix``."""
    return f"{key_prefix}.api-keys"


class ApiKeyJournal:
    """Writes key records to the journal topic and restores an empty store from it.

    Args:
        kafka: librdkafka settings.
        topic: The journal topic (see :func:`journal_topic`).
    """

    def __init__(self, kafka: Mapping[str, str], topic: str) -> None:
        self.kafka = dict(kafka)
        self.topic = topic
        self.spec = TopicSpec(
            topic, 1, "id", ("ApiKeyRecord",), config=(("cleanup.policy", "compact"),)
        )

    def record(self, store: ApiKeyStore, key_id: str) -> None:
        """Journal the stored record of ``key_id`` and wait for the broker's acknowledgement.

        Raises:
            ApiKeyStoreError: The record is missing, or the broker did not acknowledge it.
        """
        raw = store.record_of(key_id)
        if raw is None:
            msg = f"no API key {key_id} to journal"
            raise ApiKeyStoreError(msg)
        try:
            ensure_topics(self.kafka, [self.spec])
            sent = Deliveries(output_producer(self.kafka), f"the record of key {key_id}")
            sent.produce(self.topic, raw, key_id.encode(), [])
            sent.wait()
        except Exception as exc:  # any broker failure: the caller decides what it means
            msg = f"the broker did not take the journal record of key {key_id} ({exc})"
            raise ApiKeyStoreError(msg) from exc

    def restore(self, store: ApiKeyStore) -> int:
        """Fill an empty key store from the journal; the number of records written.

        Raises:
            ApiKeyStoreError: Redis failed, or the journal could not be read.
        """
        if not store.empty():
            return 0
        try:
            records = self._latest()
        except (KafkaException, RefoldError, RuntimeError, ValueError) as exc:
            msg = f"cannot read the API keys' journal {self.topic} ({exc})"
            raise ApiKeyStoreError(msg) from exc
        restored = store.restore(records)
        if restored:
            logger.warning(
                "the API key store was empty: restored %d key record(s) from %s",
                restored,
                self.topic,
            )
        return restored

    def _latest(self) -> dict[str, bytes]:
        """The latest record per key id in the journal (empty when there is no journal)."""
        admin = AdminClient(dict[str, str | int | float | bool](self.kafka))
        if self.topic not in admin.list_topics(timeout=10).topics:
            return {}  # no key was ever journaled here
        with LogOffsets(self.kafka) as offsets:
            end = offsets.end_offsets([(self.topic, 0)])[(self.topic, 0)]
        latest: dict[str, bytes] = {}
        if not end:
            return latest
        consumer = passive_consumer(self.kafka, "refold-api-keys-restore")  # never joined
        try:
            consumer.assign([TopicPartition(self.topic, 0, 0)])
            position, deadline = 0, time.monotonic() + _READ_TIMEOUT_S
            while position < end:
                if time.monotonic() > deadline:
                    msg = f"read {position} of {end} records within {_READ_TIMEOUT_S:.0f}s"
                    raise RuntimeError(msg)
                for message in consumer.consume(1000, timeout=0.5):
                    error = message.error()
                    if error is not None:
                        if error.code() == KafkaError._PARTITION_EOF:  # noqa: SLF001
                            continue
                        raise KafkaException(error)
                    key, value = message.key(), message.value()
                    if key is not None and value is not None:
                        latest[key.decode()] = value
                    position = (message.offset() or 0) + 1
        finally:
            consumer.close()
        return latest
