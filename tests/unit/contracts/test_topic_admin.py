"""Topic creation's answer to a fenced broker: asked again, while other refusals fail at once."""

from __future__ import annotations

from concurrent.futures import Future

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import NewTopic  # type: ignore[attr-defined]

from refold.contracts.errors import RefoldError
from refold.contracts.kafka.admin import _create

_FENCED = KafkaError(
    KafkaError.INVALID_REPLICATION_FACTOR,
    "Unable to replicate the partition 1 time(s): All brokers are currently fenced, or have "
    "all their log directories cordoned.",
)
_TOO_MANY_REPLICAS = KafkaError(
    KafkaError.INVALID_REPLICATION_FACTOR,
    "Unable to replicate the partition 3 time(s): The target replication factor of 3 cannot "
    "be reached because only 1 broker(s) are registered.",
)


class _Admin:
    """Answers each CreateTopics with the next of ``answers`` (an error, or None: created)."""

    def __init__(self, *answers: KafkaError | None) -> None:
        self.answers = list(answers)
        self.asked: list[list[str]] = []

    def create_topics(self, topics: list[NewTopic], operation_timeout: float) -> dict:
        self.asked.append([t.topic for t in topics])
        answer = self.answers.pop(0)
        futures = {}
        for topic in topics:
            future: Future = Future()
            if answer is None:
                future.set_result(None)
            else:
                future.set_exception(KafkaException(answer))
            futures[topic.topic] = future
        return futures


def test_a_topic_refused_by_a_fenced_broker_is_created_on_the_next_ask():
    admin = _Admin(_FENCED, _FENCED, None)
    _create(admin, [NewTopic("orders", 8)], timeout=30)
    assert admin.asked == [["orders"], ["orders"], ["orders"]]


def test_a_replication_factor_larger_than_the_cluster_fails_at_once():
    admin = _Admin(_TOO_MANY_REPLICAS)
    with pytest.raises(RefoldError, match=r"could not create topic orders: .*only 1 broker"):
        _create(admin, [NewTopic("orders", 8, 3)], timeout=30)
    assert len(admin.asked) == 1


def test_a_broker_fenced_past_the_timeout_is_a_clear_error():
    admin = _Admin(*[_FENCED] * 100)
    with pytest.raises(RefoldError, match=r"could not create topic orders: .*fenced"):
        _create(admin, [NewTopic("orders", 8)], timeout=0.5)
