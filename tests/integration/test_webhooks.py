"""Webhook delivery on real servers: Apache Kafka, redis-server and a local HTTP receiver.

Every insight is delivered at least once, with its origin as Idempotency-Key, through receiver
failures, outages shorter and longer than the retry budget (dead letters, then redrive), a
kill -9 mid-batch, a clean stop mid-outage, and permanent refusals. Nothing is ever lost:
delivered plus dead-lettered is always every insight.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from confluent_kafka import Consumer, TopicPartition

from refold.contracts.codec import EventCodec
from refold.contracts.kafka.admin import delete_topics
from refold.contracts.kafka.offsets import LogOffsets
from refold.contracts.kafka.outputs import Deliveries, output_producer
from refold.contracts.service_keys import WebhookKeys
from refold.contracts.store.connect import redis_client as open_redis
from refold.deploy.simulators.insights import SimulatedInsight, insights, produce_insights
from refold.deploy.simulators.webhook_receiver import WebhookReceiver
from refold.services.webhooks import (
    DispatcherThread,
    WebhookDispatcher,
    WebhookSettings,
    WebhookStore,
)
from tests.support.waiting import assert_eventually

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    client = open_redis(redis_url)
    yield client
    client.close()


@pytest.fixture
def receiver() -> Iterator[WebhookReceiver]:
    with WebhookReceiver() as running:
        yield running


@pytest.fixture
def name(unique: str, kafka_bootstrap: str) -> Iterator[str]:
    """The dispatcher's name; its dead-letter topic is deleted afterwards."""
    dispatcher = f"wh-{unique}"
    yield dispatcher
    delete_topics({"bootstrap.servers": kafka_bootstrap}, [f"{dispatcher}.webhook-dlq"])


@pytest.fixture
def prefix(unique: str) -> str:
    return f"test-{unique}"


def _settings(name: str, url: str, topic: str, **overrides: Any) -> WebhookSettings:
    fields: dict[str, Any] = {
        "name": name,
        "url": url,
        "topics": (topic,),
        "batch_size": 50,
        "max_attempts": 6,
        "backoff_initial_s": 0.05,
        "backoff_max_s": 0.2,
        "timeout_s": 2.0,
        "connect_timeout_s": 0.5,
        "poll_timeout_s": 0.1,
        **overrides,
    }
    return WebhookSettings(**fields)


def _dispatcher(
    settings: WebhookSettings, kafka_bootstrap: str, client: redis.Redis, prefix: str, **kw: Any
) -> WebhookDispatcher:
    return WebhookDispatcher(settings, {"bootstrap.servers": kafka_bootstrap}, client, prefix, **kw)


def _produce(kafka_bootstrap: str, topic: str, count: int, seed: int) -> list[SimulatedInsight]:
    # One source topic per seed: each call's origin ids are its own, as a processor's are.
    records = list(insights(count, seed=seed, source_topic=f"orders-{seed}"))
    produce_insights(kafka_bootstrap, topic, records)
    return records


def _dead_letters(kafka_bootstrap: str, topic: str) -> list[tuple[dict[str, str], bytes | None]]:
    """Every record of a dead-letter topic (one partition), read by a consumer closed after.

    Not ``read_log``: its consumer is cached for the process, and librdkafka crashed
    (SIGSEGV in rd_kafka_metadata_cache_find) refreshing metadata of topics it had read after
    the tests deleted them.
    """
    kafka = {"bootstrap.servers": kafka_bootstrap}
    with LogOffsets(kafka) as offsets:
        end = offsets.end_offsets([(topic, 0)])[(topic, 0)]
    out: list[tuple[dict[str, str], bytes | None]] = []
    if not end:
        return out
    consumer = Consumer(
        {
            **kafka,
            "group.id": "test-webhooks-dlq-reader",  # never joined (assign) nor committed
            "enable.auto.commit": False,
            "allow.auto.create.topics": False,
            "fetch.wait.max.ms": 50,
        }
    )
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])

        def read_all() -> bool:
            for message in consumer.consume(500, 0.5):
                if message.error() is None and message.offset() < end:
                    headers = {k: (v or b"").decode() for k, v in message.headers() or []}
                    out.append((headers, message.value()))
            return len(out) >= end

        assert_eventually(read_all, timeout=30, interval=0)
    finally:
        consumer.close()
    return out


def _store(client: redis.Redis, name: str, prefix: str) -> WebhookStore:
    return WebhookStore(client, WebhookKeys(name, prefix), 1000)


def _check_requests(receiver: WebhookReceiver, records: list[SimulatedInsight]) -> None:
    """Every request carries its insight's key: a key always names the same insight."""
    by_key = {r.origin_id: r.fields["insight_id"] for r in records}
    for request in list(receiver.requests):
        assert request.key is not None
        assert request.body["id"] == request.key
        assert by_key[request.key] == request.body["data"]["insight_id"]
        assert request.body["origin"]["id"] == request.key


def test_every_insight_is_delivered_once_with_its_origin_as_key(
    kafka_bootstrap, make_topic, redis_client, receiver, name, prefix
):
    topic = make_topic(partitions=4, prefix="insights")
    records = _produce(kafka_bootstrap, topic, 200, seed=1)
    settings = _settings(name, receiver.url, topic)
    running = _dispatcher(settings, kafka_bootstrap, redis_client, prefix).start()
    try:
        assert_eventually(
            lambda: len(receiver.accepted) == 200,
            timeout=30,
            message=lambda: str(receiver.snapshot()),
        )
    finally:
        running.stop()
    assert set(receiver.accepted) == {r.origin_id for r in records}
    assert receiver.duplicates == 0
    assert receiver.snapshot()["requests"] == 200
    _check_requests(receiver, records)
    first = receiver.requests[0]
    assert first.headers["refold-attempt"] == "1"
    assert first.headers["refold-topic"] == topic
    assert first.headers["content-type"] == "application/json"
    assert first.body["type"] == "Insight"
    assert first.body["origin"]["processor"] == "order_patterns"
    store = _store(redis_client, name, prefix)
    assert store.counters() == {"delivered": 200}
    positions = store.positions()
    assert sum(positions.values()) == 200  # every partition's next offset is its end
    entries = store.recent(500)
    assert len(entries) == 200
    assert {e.status for e in entries} == {"delivered"}
    assert {e.code for e in entries} == {200}
    assert all(e.latency_ms > 0 and e.time_ms > 0 for e in entries)
    assert _dead_letters(kafka_bootstrap, settings.dlq_topic) == []


def test_a_receiver_failing_every_third_request_gets_every_insight(
    kafka_bootstrap, make_topic, redis_client, name, prefix
):
    topic = make_topic(partitions=2, prefix="insights")
    records = _produce(kafka_bootstrap, topic, 150, seed=2)
    with WebhookReceiver(fail_every=3, retry_after="0") as receiver:
        settings = _settings(name, receiver.url, topic)
        running = _dispatcher(settings, kafka_bootstrap, redis_client, prefix).start()
        try:
            assert_eventually(
                lambda: len(receiver.accepted) == 150,
                timeout=30,
                message=lambda: str(receiver.snapshot()),
            )
        finally:
            running.stop()
        failures = receiver.snapshot()["by_status"][503]
    assert failures >= 150 // 3
    assert receiver.duplicates == 0
    _check_requests(receiver, records)
    retried = [r for r in receiver.requests if r.headers["refold-attempt"] != "1"]
    assert len(retried) == failures  # each 503 was followed by one more attempt
    store = _store(redis_client, name, prefix)
    assert store.counters() == {"delivered": 150, "retried": failures}
    entries = store.recent(1000)
    retries = [e for e in entries if e.status == "retry"]
    assert len(retries) == failures
    assert {e.code for e in retries} == {503}
    assert {e.error for e in retries} == {"HTTP 503"}
    delivered = [e for e in entries if e.status == "delivered"]
    assert len(delivered) == 150
    assert max(e.attempts for e in delivered) >= 2
    assert _dead_letters(kafka_bootstrap, settings.dlq_topic) == []


def test_an_outage_shorter_than_the_retry_budget_loses_nothing(
    kafka_bootstrap, make_topic, redis_client, receiver, name, prefix
):
    topic = make_topic(partitions=4, prefix="insights")
    records = _produce(kafka_bootstrap, topic, 100, seed=3)
    # 16 attempts: at least ~9 s of backoff per insight, so that a busy machine still reaches
    # 20 retries (the consumer first joins its group) well inside the outage's premise.
    settings = _settings(name, receiver.url, topic, max_attempts=16, backoff_max_s=1.0)
    dispatcher = _dispatcher(settings, kafka_bootstrap, redis_client, prefix)
    floor = dispatcher.policy.budget_bounds()[0]
    receiver.down()
    down_at = time.monotonic()
    running = dispatcher.start()
    try:
        # Down until the first insights have been retried several times.
        assert_eventually(
            lambda: dispatcher.stats.retried >= 20,
            timeout=floor,
            message=lambda: f"retried {dispatcher.stats.retried}",
        )
        outage = time.monotonic() - down_at
        receiver.up()
        assert_eventually(
            lambda: len(receiver.accepted) == 100,
            timeout=30,
            message=lambda: str(receiver.snapshot()),
        )
    finally:
        running.stop()
    assert outage < floor  # the premise: shorter than the least retry budget
    assert set(receiver.accepted) == {r.origin_id for r in records}
    counters = _store(redis_client, name, prefix).counters()
    assert counters["delivered"] == 100
    assert counters["retried"] >= 20
    assert "failed" not in counters
    assert _dead_letters(kafka_bootstrap, settings.dlq_topic) == []
    refused = [e for e in _store(redis_client, name, prefix).recent(2000) if e.status == "retry"]
    assert refused
    assert all(e.code == 0 and "ConnectError" in e.error for e in refused)


def test_a_longer_outage_dead_letters_with_reason_and_origin_and_redrive_delivers(
    kafka_bootstrap, make_topic, redis_client, receiver, name, prefix
):
    topic = make_topic(partitions=2, prefix="insights")
    settings = _settings(name, receiver.url, topic, max_attempts=3, backoff_max_s=0.1)
    dispatcher = _dispatcher(settings, kafka_bootstrap, redis_client, prefix)
    running = dispatcher.start()
    try:
        before = _produce(kafka_bootstrap, topic, 30, seed=4)
        assert_eventually(lambda: len(receiver.accepted) == 30, timeout=30)
        receiver.down()
        during = _produce(kafka_bootstrap, topic, 40, seed=5)
        assert_eventually(
            lambda: dispatcher.stats.failed == 40,
            timeout=30,
            message=lambda: f"{dispatcher.stats}",
        )
        receiver.up()
        after = _produce(kafka_bootstrap, topic, 20, seed=6)
        assert_eventually(lambda: len(receiver.accepted) == 50, timeout=30)
    finally:
        running.stop()
    everything = {r.origin_id for r in before + during + after}
    letters = _dead_letters(kafka_bootstrap, settings.dlq_topic)
    dead = {headers["refold.webhook.id"] for headers, _value in letters}
    assert dead == {r.origin_id for r in during}
    assert set(receiver.accepted) | dead == everything  # none lost
    assert not set(receiver.accepted) & dead
    values = {r.origin_id: r for r in during}
    codec = EventCodec()
    for headers, value in letters:
        assert headers["refold.reason"] == "webhook-failed"
        assert "ConnectError" in headers["refold.error"]
        assert headers["refold.attempts"] == "3"
        assert headers["refold.webhook.name"] == name
        assert headers["refold.webhook.topic"] == topic
        key = headers["refold.webhook.id"]
        assert headers["refold.origin.id"] == key  # the original headers travel along
        assert headers["refold.processor"] == "order_patterns"
        assert codec.decode(value).data == {**values[key].fields}
    counters = _store(redis_client, name, prefix).counters()
    assert counters["failed"] == counters["failed:webhook-failed"] == 40
    assert counters["delivered"] == 50

    redrive = _dispatcher(settings, kafka_bootstrap, redis_client, prefix, role="redrive")
    redrive.run()  # up to the dead-letter topic's end, then returns
    assert redrive.stats.delivered == 40
    assert set(receiver.accepted) == everything
    assert receiver.duplicates == 0
    redriven = [r for r in receiver.requests if "refold-redrive" in r.headers]
    assert {r.key for r in redriven} == dead
    assert all(r.headers["refold-redrive"] == "1" for r in redriven)
    _check_requests(receiver, before + during + after)
    assert _store(redis_client, name, prefix).counters()["redriven"] == 40
    again = _dispatcher(settings, kafka_bootstrap, redis_client, prefix, role="redrive")
    again.run()  # a second redrive starts where the first one stopped: nothing to do
    assert again.stats.delivered == again.stats.failed == 0


def _run_cli(
    env: dict[str, str], topic: str, name: str, url: str, log: Path, *extra: str
) -> subprocess.Popen[bytes]:
    argv = [
        sys.executable,
        "-m",
        "refold.deploy.cli",
        "webhooks",
        "run",
        "--name",
        name,
        "--topic",
        topic,
        "--url",
        url,
        "--batch-size",
        "50",
        "--max-uncommitted",
        "100",
        "--concurrency",
        "2",
        "--backoff-initial",
        "0.05",
        "--backoff-max",
        "0.2",
        *extra,
    ]
    with log.open("ab") as out:
        return subprocess.Popen(argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)


def test_a_dispatcher_killed_mid_batch_resumes_from_its_redis_positions(
    kafka_bootstrap, redis_url, make_topic, redis_client, name, prefix, tmp_path
):
    topic = make_topic(partitions=4, prefix="insights")
    records = _produce(kafka_bootstrap, topic, 300, seed=7)
    env = {
        **os.environ,
        "REFOLD_KAFKA__BOOTSTRAP_SERVERS": kafka_bootstrap,
        "REFOLD_REDIS__URL": redis_url,
        "REFOLD_REDIS__KEY_PREFIX": prefix,
    }
    log = tmp_path / "dispatcher.log"
    store = _store(redis_client, name, prefix)
    with WebhookReceiver(delay_s=0.01) as receiver:  # ~50 requests/s per connection
        first = _run_cli(env, topic, name, receiver.url, log)
        try:
            # Killed once at least one batch is committed and the next one is under way.
            assert_eventually(
                lambda: (
                    (done := store.counters().get("delivered", 0)) >= 50
                    and len(receiver.accepted) >= done + 5
                ),
                timeout=60,
                interval=0.01,
                message=lambda: log.read_text(),
                alive=lambda: first.poll() is None,
            )
            first.send_signal(signal.SIGKILL)
            first.wait(timeout=10)
        finally:
            if first.poll() is None:
                first.kill()
        # Requests sent before the kill may still be in the receiver (its delay).
        assert_eventually(lambda: receiver.in_progress == 0, timeout=10)
        committed = sum(store.positions().values())
        delivered_before = len(receiver.accepted)
        assert committed < delivered_before < 300  # killed with a batch half delivered
        second = _run_cli(env, topic, name, receiver.url, log, "--once")
        assert second.wait(timeout=120) == 0, log.read_text()
    assert set(receiver.accepted) == {r.origin_id for r in records}
    assert sum(store.positions().values()) == 300
    # Re-delivered: at most the uncommitted records, each with the key it had before.
    assert 0 < receiver.duplicates <= min(delivered_before - committed, 100)
    _check_requests(receiver, records)
    assert "caught up" in log.read_text()


def test_a_stop_during_an_outage_commits_only_what_was_delivered(
    kafka_bootstrap, make_topic, redis_client, receiver, name, prefix
):
    topic = make_topic(partitions=2, prefix="insights")
    records = _produce(kafka_bootstrap, topic, 40, seed=8)
    settings = _settings(name, receiver.url, topic, max_attempts=50, backoff_max_s=2.0)
    receiver.down()
    dispatcher = _dispatcher(settings, kafka_bootstrap, redis_client, prefix)
    running = dispatcher.start()
    assert_eventually(lambda: dispatcher.stats.retried >= 40, timeout=30)
    started = time.monotonic()
    running.stop()
    assert time.monotonic() - started < 5  # backoffs are interrupted, not waited out
    store = _store(redis_client, name, prefix)
    assert sum(store.positions().values()) == 0  # nothing was delivered: nothing moved
    assert "delivered" not in store.counters()
    assert _dead_letters(kafka_bootstrap, settings.dlq_topic) == []
    receiver.up()
    again = _dispatcher(settings, kafka_bootstrap, redis_client, prefix, until_end=True)
    again.run()
    assert set(receiver.accepted) == {r.origin_id for r in records}
    assert sum(store.positions().values()) == 40


def test_permanent_refusals_and_undecodable_records_are_dead_lettered_at_once(
    kafka_bootstrap, make_topic, redis_client, name, prefix
):
    topic = make_topic(partitions=2, prefix="insights")
    records = _produce(kafka_bootstrap, topic, 60, seed=9)
    refused = {r.origin_id for r in records if r.fields["pattern"] == "card-testing"}
    assert 0 < len(refused) < 60
    sent = Deliveries(output_producer({"bootstrap.servers": kafka_bootstrap}), "a bad record")
    sent.produce(topic, b"not avro at all", b"bad", [("refold.origin.id", b"bad|x/0@1.0")])
    sent.wait()

    def reject(body: dict[str, Any]) -> int | None:
        return 422 if body["data"]["pattern"] == "card-testing" else None

    with WebhookReceiver(reject=reject) as receiver:
        settings = _settings(name, receiver.url, topic, max_attempts=5)
        dispatcher = _dispatcher(settings, kafka_bootstrap, redis_client, prefix, until_end=True)
        dispatcher.run()
    assert set(receiver.accepted) == {r.origin_id for r in records} - refused
    seen = receiver.keys_seen()
    assert all(seen[key] == 1 for key in refused)  # one attempt each: no retry of a 4xx
    assert "bad|x/0@1.0" not in seen  # never sent
    letters = _dead_letters(kafka_bootstrap, settings.dlq_topic)
    by_key = {headers["refold.webhook.id"]: headers for headers, _value in letters}
    assert set(by_key) == refused | {"bad|x/0@1.0"}
    for key in refused:
        assert by_key[key]["refold.reason"] == "webhook-rejected"
        assert by_key[key]["refold.error"] == "HTTP 422"
        assert by_key[key]["refold.webhook.status"] == "422"
        assert by_key[key]["refold.attempts"] == "1"
    assert by_key["bad|x/0@1.0"]["refold.reason"] == "bad-magic"
    assert by_key["bad|x/0@1.0"]["refold.attempts"] == "0"
    counters = _store(redis_client, name, prefix).counters()
    assert counters["failed:webhook-rejected"] == len(refused)
    assert counters["failed:bad-magic"] == 1
    assert counters["delivered"] == 60 - len(refused)


def test_signed_requests_verify_at_the_receiver_and_log_reads_back(
    kafka_bootstrap, redis_url, make_topic, redis_client, name, prefix
):
    topic = make_topic(partitions=1, prefix="insights")
    records = _produce(kafka_bootstrap, topic, 10, seed=10)
    secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"  # noqa: S105 - the spec's example key
    with WebhookReceiver(signing_secret=secret) as receiver:
        settings = _settings(
            name,
            receiver.url,
            topic,
            signing_secret=secret,
            headers={"Authorization": "Bearer t0ken"},
        )
        _dispatcher(settings, kafka_bootstrap, redis_client, prefix, until_end=True).run()
    assert set(receiver.accepted) == {r.origin_id for r in records}
    assert {r.status for r in receiver.requests} == {200}
    assert all(r.headers["authorization"] == "Bearer t0ken" for r in receiver.requests)
    assert all(r.headers["webhook-id"] == r.key for r in receiver.requests)
    env = {**os.environ, "REFOLD_REDIS__URL": redis_url, "REFOLD_REDIS__KEY_PREFIX": prefix}
    shown = subprocess.run(
        [sys.executable, "-m", "refold.deploy.cli", "webhooks", "log", "--name", name, "-n", "3"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert f"dispatcher {name}: delivered 10" in shown
    assert shown.count("delivered ") >= 3
    assert "t0ken" not in shown


def test_only_critical_insights_are_pushed_unless_told_otherwise(
    kafka_bootstrap, make_topic, redis_client, receiver, name, prefix
):
    topic = make_topic(partitions=2, prefix="insights")
    records = list(insights(30, seed=11, source_topic="orders-11", warning_every=3))
    produce_insights(kafka_bootstrap, topic, records)
    critical = {r.origin_id for r in records if r.fields["severity"] == "critical"}
    assert len(critical) == 20
    settings = _settings(name, receiver.url, topic)
    dispatcher = _dispatcher(settings, kafka_bootstrap, redis_client, prefix, until_end=True)
    dispatcher.run()
    assert set(receiver.accepted) == critical
    store = _store(redis_client, name, prefix)
    assert store.counters() == {"delivered": 20, "skipped": 10}
    assert sum(store.positions().values()) == 30  # skipped records are passed, not held
    assert len(store.recent(100)) == 20  # and not logged one by one
    every = _settings(f"{name}-all", receiver.url, topic, severities=())
    _dispatcher(every, kafka_bootstrap, redis_client, prefix, until_end=True).run()
    assert set(receiver.accepted) == {r.origin_id for r in records}
    assert receiver.duplicates == 20  # the second dispatcher sent the critical ones again
    delete_topics({"bootstrap.servers": kafka_bootstrap}, [every.dlq_topic])


def test_insights_written_in_transactions_settle_up_to_the_end_of_the_log(
    kafka_bootstrap, make_topic, redis_client, receiver, name, prefix
):
    # A processor writes its insights in Kafka transactions; each ends with a commit marker, an
    # offset no consumer reads. The positions must still reach the log's end: until_end ends,
    # and the demo, which waits for the end offsets, is not left waiting (it was, for 120 s).
    topic = make_topic(partitions=2, prefix="insights")
    records = list(insights(40, seed=12, source_topic="orders-12"))
    produce_insights(kafka_bootstrap, topic, records, per_transaction=10)
    kafka = {"bootstrap.servers": kafka_bootstrap}
    with LogOffsets(kafka) as offsets:
        ends = offsets.end_offsets([(topic, 0), (topic, 1)])
    assert sum(ends.values()) > len(records)  # the markers take offsets
    settings = _settings(name, receiver.url, topic)
    dispatcher = _dispatcher(settings, kafka_bootstrap, redis_client, prefix, until_end=True)
    with DispatcherThread(dispatcher).start() as running:
        running.join(60)
        assert not running.alive, "until_end did not end: a position stayed below a marker"
    assert set(receiver.accepted) == {r.origin_id for r in records}
    assert _store(redis_client, name, prefix).positions() == ends


def test_a_redis_that_lost_the_positions_delivers_nothing_twice(
    kafka_bootstrap, make_topic, redis_client, receiver, name, prefix
):
    # Redis restarted empty: the dispatcher's positions have a copy in its Kafka consumer
    # group, committed after each Redis commit, and it resumes from the later of the two.
    topic = make_topic(partitions=2, prefix="insights")
    first = _produce(kafka_bootstrap, topic, 60, seed=31)
    settings = _settings(name, receiver.url, topic)
    running = _dispatcher(settings, kafka_bootstrap, redis_client, prefix).start()
    try:
        assert_eventually(lambda: len(receiver.accepted) == 60, timeout=30)
    finally:
        running.stop()
    keys = WebhookKeys(name, prefix)
    assert redis_client.delete(keys.positions, keys.log, keys.counters) == 3  # lost
    later = _produce(kafka_bootstrap, topic, 20, seed=32)
    running = _dispatcher(settings, kafka_bootstrap, redis_client, prefix).start()
    try:
        assert_eventually(lambda: len(receiver.accepted) == 80, timeout=30)
        time.sleep(1.0)  # anything delivered again would arrive now
    finally:
        running.stop()
    assert receiver.duplicates == 0
    assert receiver.snapshot()["requests"] == 80
    assert set(receiver.accepted) == {r.origin_id for r in [*first, *later]}
    assert sum(_store(redis_client, name, prefix).positions().values()) == 80


def test_a_dispatcher_of_the_same_name_in_another_deployment_keeps_its_own_copy(
    kafka_bootstrap, make_topic, redis_client, receiver, name, prefix
):
    # Two deployments (key prefixes) on one Kafka cluster, each with a dispatcher of the same
    # name on the same topic: the other's copy of its positions in Kafka is not this one's
    # (resuming from it would skip every insight the other delivered and this one never did).
    topic = make_topic(partitions=2, prefix="insights")
    records = _produce(kafka_bootstrap, topic, 30, seed=41)
    settings = _settings(name, receiver.url, topic)
    _dispatcher(settings, kafka_bootstrap, redis_client, prefix, until_end=True).run()
    assert receiver.snapshot()["requests"] == 30
    staging = f"{prefix}-staging"
    _dispatcher(settings, kafka_bootstrap, redis_client, staging, until_end=True).run()
    assert receiver.snapshot()["requests"] == 60  # every insight again, for the other one
    assert receiver.duplicates == 30
    assert set(receiver.accepted) == {r.origin_id for r in records}
    assert sum(_store(redis_client, name, staging).positions().values()) == 30
