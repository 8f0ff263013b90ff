"""Webhook delivery, the pure parts: classification, backoff, identity, payload, settings, CLI."""

from __future__ import annotations

import base64
import dataclasses
import json
import random
import threading
from concurrent.futures import Future
from datetime import UTC, datetime
from email.utils import format_datetime

import httpx
import pytest
from confluent_kafka import Message
from pydantic import SecretStr, ValidationError

from refold.contracts.codec import EventCodec
from refold.contracts.service_keys import WebhookKeys
from refold.deploy.simulators.insights import insights
from refold.deploy.webhooks_cli import build_parser, main as cli_main
from refold.services.webhooks.config import WebhookSettings, mirror_group
from refold.services.webhooks.delivery import (
    AttemptResult,
    RetryPolicy,
    WebhookSender,
    is_retriable_exception,
    is_retriable_status,
    parse_retry_after,
    payload_json,
    sign,
)
from refold.services.webhooks.items import (
    DLQ_HEADERS,
    dead_letter_headers,
    fallback_key,
    header_safe,
    item_from_message,
)
from refold.services.webhooks.scheduling import AttemptScheduler, ProgressReport, UncommittedWindow
from refold.services.webhooks.store import LogEntry
from tests.support.waiting import assert_eventually

POLICY = RetryPolicy(max_attempts=12, initial_s=0.5, max_s=120.0)
# The example key of the Standard Webhooks specification (standardwebhooks.com), not a secret.
SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"  # noqa: S105


def _result(status: int | None, *, retry_after: float | None = None) -> AttemptResult:
    retriable = status is None or is_retriable_status(status)
    if status is not None and 200 <= status < 300:
        retriable = False
    return AttemptResult(status, None if status else "ConnectError: x", retriable, retry_after, 1.0)


@pytest.mark.parametrize(
    ("status", "retriable"),
    [
        (500, True),
        (502, True),
        (503, True),
        (504, True),
        (599, True),
        (408, True),
        (409, True),
        (425, True),
        (429, True),
        (400, False),
        (401, False),
        (403, False),
        (404, False),
        (410, False),
        (413, False),
        (422, False),
        (301, False),
        (302, False),
    ],
)
def test_statuses_are_retried_or_permanent(status, retriable):
    assert is_retriable_status(status) is retriable


@pytest.mark.parametrize(
    ("exc", "retriable"),
    [
        (httpx.ConnectError("refused"), True),
        (httpx.ConnectTimeout("slow"), True),
        (httpx.ReadTimeout("slow"), True),
        (httpx.WriteTimeout("slow"), True),
        (httpx.PoolTimeout("busy"), True),
        (httpx.ReadError("reset"), True),
        (httpx.RemoteProtocolError("garbage"), True),
        (httpx.UnsupportedProtocol("ftp"), False),
        (httpx.LocalProtocolError("bad header"), False),
        (httpx.TooManyRedirects("loop"), False),
    ],
)
def test_transport_errors_are_retried_unless_they_would_repeat(exc, retriable):
    assert is_retriable_exception(exc) is retriable


def test_retry_after_takes_seconds_or_a_date():
    now = 1_700_000_000.0
    assert parse_retry_after("7", now) == 7.0
    assert parse_retry_after(" 0 ", now) == 0.0
    date = format_datetime(datetime.fromtimestamp(now + 30, tz=UTC), usegmt=True)
    assert parse_retry_after(date, now) == pytest.approx(30.0)
    past = format_datetime(datetime.fromtimestamp(now - 30, tz=UTC), usegmt=True)
    assert parse_retry_after(past, now) == 0.0
    for bad in (None, "", "soon", "-5", "1.5"):
        assert parse_retry_after(bad, now) is None


def test_each_backoff_lies_in_its_equal_jitter_window():
    random.seed(1)
    for attempt in range(1, 12):
        low, high = POLICY.window(attempt)
        assert high == min(120.0, 0.5 * 2 ** (attempt - 1))
        assert low == high / 2
        for _ in range(200):
            state = POLICY.new_state()
            state.attempt_number = attempt
            delay = POLICY.next_delay(state, _result(503))
            assert delay is not None
            assert low <= delay <= high
            assert state.attempt_number == attempt + 1


def test_backoffs_are_jittered():
    delays = set()
    for _ in range(50):
        state = POLICY.new_state()
        delays.add(POLICY.next_delay(state, _result(None)))
    assert len(delays) > 40


def test_the_retry_budget_has_a_floor_and_a_ceiling():
    # windows: 0.5, 1, 2, 4, 8, 16, 32, 64, 120, 120, 120 (11 backoffs for 12 attempts)
    assert POLICY.budget_bounds() == (243.75, 487.5)
    low, high = RetryPolicy(3, 0.05, 0.1).budget_bounds()
    assert (low, high) == pytest.approx((0.075, 0.15))
    assert RetryPolicy(1, 1.0, 10.0).budget_bounds() == (0, 0)


def test_attempts_stop_at_the_maximum_and_permanent_failures_at_once():
    policy = RetryPolicy(max_attempts=3, initial_s=0.01, max_s=0.02)
    state = policy.new_state()
    assert policy.next_delay(state, _result(503)) is not None
    assert policy.next_delay(state, _result(None)) is not None
    assert policy.next_delay(state, _result(503)) is None  # the third attempt was the last
    assert policy.next_delay(policy.new_state(), _result(422)) is None
    assert policy.next_delay(policy.new_state(), _result(200)) is None


def test_retry_after_raises_the_backoff_up_to_the_cap():
    policy = RetryPolicy(max_attempts=5, initial_s=0.1, max_s=10.0)
    assert policy.next_delay(policy.new_state(), _result(429, retry_after=4.0)) == 4.0
    assert policy.next_delay(policy.new_state(), _result(503, retry_after=60.0)) == 10.0
    short = policy.next_delay(policy.new_state(), _result(503, retry_after=0.0))
    assert short is not None
    assert 0.05 <= short <= 0.1


def test_the_signature_is_the_standard_webhooks_one():
    # The example of the Standard Webhooks specification (standardwebhooks.com).
    body = b'{"test": 2432232314}'
    expected = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
    assert sign(SECRET, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body) == expected


def test_payload_json_writes_avro_bytes_as_base64():
    document = json.loads(payload_json({"a": b"\x00\xff", "b": [1, "x"], "c": None}))
    assert document == {"a": base64.b64encode(b"\x00\xff").decode(), "b": [1, "x"], "c": None}


def test_header_values_are_printable_ascii():
    assert header_safe("order_patterns|t/1@5.0") == "order_patterns|t/1@5.0"
    assert header_safe("café\n") == "caf%C3%A9%0A"


def _message(value, headers, *, topic="p.insights", partition=1, offset=5, key=b"customer-1"):
    return Message(
        topic=topic,
        partition=partition,
        offset=offset,
        key=key,
        value=value,
        headers=headers,
        timestamp=(1, 1_767_225_600_123),
    )


CODEC = EventCodec()
RECORD = next(insights(1))
VALUE = CODEC.encode("Insight", RECORD.fields)


def test_an_insight_goes_out_under_its_origin_id_with_its_fields():
    item = item_from_message(_message(VALUE, RECORD.headers), CODEC, POLICY.new_state())
    assert item.key == RECORD.origin_id
    assert (item.topic, item.partition, item.offset) == ("p.insights", 1, 5)
    assert item.final is None
    body = json.loads(item.body)
    assert body["id"] == RECORD.origin_id
    assert body["type"] == "Insight"
    assert body["version"] == 1
    assert body["key"] == "customer-1"
    assert body["timestamp"] == 1_767_225_600_123
    assert body["data"] == {**RECORD.fields}
    assert body["origin"]["id"] == RECORD.origin_id
    assert body["origin"]["topic"] == "commerce.orders"
    assert isinstance(body["origin"]["offset"], int)
    assert body["origin"]["generation"] == 1
    headers = item.request_headers("pager")
    assert headers["Idempotency-Key"] == RECORD.origin_id
    assert headers["Refold-Attempt"] == "1"
    assert headers["Refold-Dispatcher"] == "pager"
    assert "Refold-Redrive" not in headers


def test_without_an_origin_the_key_is_the_records_own_position():
    item = item_from_message(_message(VALUE, None, offset=9), CODEC, POLICY.new_state())
    assert item.key == fallback_key("p.insights", 1, 9) == "p.insights/1@9"
    assert json.loads(item.body)["origin"] == {}


def test_an_undecodable_record_is_settled_at_once_with_the_decoders_reason():
    item = item_from_message(_message(b"{}", RECORD.headers), CODEC, POLICY.new_state())
    assert (item.final, item.reason) == ("failed", "bad-magic")
    assert "neither Avro single-object encoded nor registry framed" in item.error_text()
    headers = dict(dead_letter_headers(item, "pager"))
    assert headers["refold.reason"] == b"bad-magic"
    assert headers["refold.attempts"] == b"0"


def test_a_dead_letter_redriven_keeps_its_identity_and_original_headers():
    item = item_from_message(_message(VALUE, RECORD.headers), CODEC, POLICY.new_state())
    result = AttemptResult(503, None, True, None, 12.0)
    for _ in range(3):
        item.record(result)
    item.final, item.reason = "failed", "webhook-failed"
    letter = dead_letter_headers(item, "pager")
    named = {k: v for k, v in letter}
    assert named["refold.error"] == b"HTTP 503"
    assert named["refold.webhook.status"] == b"503"
    assert named["refold.attempts"] == b"3"
    assert named["refold.origin.id"] == RECORD.origin_id.encode()
    dead = _message(VALUE, letter, topic="pager.webhook-dlq", partition=0, offset=77)
    again = item_from_message(dead, CODEC, POLICY.new_state())
    assert again.key == item.key
    assert (again.topic, again.partition, again.offset) == ("p.insights", 1, 5)
    assert (again.read_topic, again.read_partition, again.read_offset) == (
        "pager.webhook-dlq",
        0,
        77,
    )
    assert again.redrives == 1
    assert not {k for k, _v in again.headers} & DLQ_HEADERS
    assert json.loads(again.body) == json.loads(item.body)
    assert again.request_headers("pager")["Refold-Redrive"] == "1"
    twice = dict(dead_letter_headers(again, "pager"))
    assert twice["refold.webhook.redrives"] == b"1"


def test_positions_advance_only_over_settled_records():
    window = UncommittedWindow()
    items = [
        item_from_message(_message(VALUE, None, partition=p, offset=o), CODEC, POLICY.new_state())
        for p, o in [(0, 10), (1, 20), (0, 11), (1, 21), (0, 12), (1, 22)]
    ]
    for item in items:
        window.add(item)
    assert window.size == 6
    assert not window.committable()
    for item in items:
        item.final = "delivered"
    items[3].final = None  # partition 1, offset 21: still being retried
    assert window.committable()
    positions, taken = window.pop_settled()
    assert positions == {("p.insights", 0): 13, ("p.insights", 1): 21}
    assert [(i.partition, i.offset) for i in taken] == [(0, 10), (0, 11), (0, 12), (1, 20)]
    assert window.size == 2  # 21, and 22 delivered but waiting behind it
    assert not window.committable()
    assert window.pop_settled() == ({}, [])
    items[3].final = "failed"
    positions, taken = window.pop_settled()
    assert positions == {("p.insights", 1): 23}
    assert [i.offset for i in taken] == [21, 22]
    assert window.size == 0


class _InlinePool:
    """Runs submitted calls at once (a ThreadPoolExecutor stand-in)."""

    def submit(self, fn, *args):
        future = Future()
        future.set_result(fn(*args))
        return future


def test_the_scheduler_retries_after_the_backoff_without_holding_a_slot():
    answers = {"a": [503, 200], "b": [200], "c": [422]}
    attempts = []

    def attempt(item):
        attempts.append(item.key)
        return _result(answers[item.key].pop(0))

    settled = {}

    def settle(item, result):
        if result.delivered or not result.retriable:
            settled[item.key] = result.status
            return None
        return 0.05  # the backoff of "a"

    scheduler = AttemptScheduler(_InlinePool(), attempt, settle, limit=1)
    stop = threading.Event()
    for key in ("a", "b", "c"):
        item = item_from_message(_message(VALUE, None), CODEC, POLICY.new_state())
        item.key = key
        scheduler.add(item)
    assert scheduler.pending == 3
    assert_eventually(lambda: scheduler.step(0.2, stop) >= 0 and not scheduler.busy, timeout=5)
    assert settled == {"a": 200, "b": 200, "c": 422}
    assert attempts[:3] == ["a", "b", "c"]  # "b" and "c" did not wait for "a"'s backoff
    assert attempts[3:] == ["a"]


def test_the_sender_classifies_answers_and_signs_requests():
    seen = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        status = int(request.headers["x-answer"])
        return httpx.Response(status, headers={"Retry-After": "3"})

    sender = WebhookSender(
        "https://receiver.example/hooks",
        timeout_s=1,
        connect_timeout_s=1,
        connections=2,
        headers={"Authorization": "Bearer s"},
        signing_secret=SECRET,
        transport=httpx.MockTransport(answer),
    )
    ok = sender.attempt(b"{}", {"x-answer": "204"}, "k1")
    assert ok.delivered
    assert ok.retry_after_s is None
    busy = sender.attempt(b"{}", {"x-answer": "429"}, "k2")
    assert (busy.delivered, busy.retriable, busy.retry_after_s, busy.describe()) == (
        False,
        True,
        3.0,
        "HTTP 429",
    )
    refused = sender.attempt(b"{}", {"x-answer": "422"}, "k3")
    assert (refused.retriable, refused.describe()) == (False, "HTTP 422")
    request = seen[0]
    assert request.headers["authorization"] == "Bearer s"
    assert request.headers["content-type"] == "application/json"
    assert request.headers["webhook-id"] == "k1"
    stamp = int(request.headers["webhook-timestamp"])
    assert request.headers["webhook-signature"] == sign(SECRET, "k1", stamp, b"{}")
    sender.close()

    def down(request: httpx.Request) -> httpx.Response:
        msg = "refused"
        raise httpx.ConnectError(msg, request=request)

    failing = WebhookSender(
        "http://127.0.0.1:9/x",
        timeout_s=1,
        connect_timeout_s=1,
        connections=1,
        transport=httpx.MockTransport(down),
    )
    result = failing.attempt(b"{}", {}, "k")
    assert (result.status, result.retriable) == (None, True)
    assert result.describe() == "ConnectError: refused"


def _settings(**overrides):
    return WebhookSettings(**{"url": "https://r.example/h", "topics": ("a.insights",), **overrides})


def test_settings_refuse_what_would_break_a_guarantee():
    assert _settings().dlq_topic == "webhooks.webhook-dlq"
    assert _settings(headers={"Authorization": "x"}).headers["Authorization"].get_secret_value()
    bad = [
        {"url": "ftp://r.example/h"},
        {"url": "not a url"},
        {"name": "a b"},
        {"headers": {"Idempotency-Key": "mine"}},
        {"backoff_initial_s": 5.0, "backoff_max_s": 1.0},
        {"connect_timeout_s": 20.0},
        {"topics": ("webhooks.webhook-dlq",)},
        {"topics": ("a", "a")},
        {"client_key": "key.pem"},
        {"concurrency": 0},
        {"surprise": 1},
    ]
    for overrides in bad:
        with pytest.raises(ValidationError):
            _settings(**overrides)
    assert "********" in repr(_settings(signing_secret=SecretStr("s3cret")))


def test_webhook_keys_share_a_hash_tag_and_read_back():
    keys = WebhookKeys("pager", "p")
    assert keys.positions == "p:{webhooks.pager}:positions"
    assert keys.lease("redrive") == "p:{webhooks.pager}:lease:redrive"
    assert {k.split("}")[0] for k in (keys.log, keys.counters, keys.positions)} == {
        "p:{webhooks.pager"
    }
    assert WebhookKeys.name_of(keys.counters, "p") == "pager"
    assert WebhookKeys.name_of(keys.log, "p") is None
    assert WebhookKeys.pattern("p") == "p:{webhooks.*}:counters"


def test_the_copy_of_the_positions_is_one_group_per_deployment_name_and_role():
    assert mirror_group("pager", "dispatch", "refold") == "refold-webhooks.pager.dispatch"
    groups = {mirror_group("pager", r, p) for r in ("dispatch", "redrive") for p in ("refold", "s")}
    assert groups == {
        "refold-webhooks.pager.dispatch",
        "refold-webhooks.pager.redrive",
        "refold-webhooks.s.pager.dispatch",
        "refold-webhooks.s.pager.redrive",
    }


def test_the_cli_explains_itself_and_refuses_bad_settings(capsys, monkeypatch):
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(["--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    for word in ("run", "log", "redrive", "Idempotency-Key"):
        assert word in out
    monkeypatch.delenv("REFOLD_WEBHOOKS__URL", raising=False)
    monkeypatch.delenv("REFOLD_WEBHOOKS__TOPICS", raising=False)
    assert cli_main(["run", "--url", "https://r.example/h"]) == 2
    assert "no topic" in capsys.readouterr().err
    assert cli_main(["run", "--topic", "a", "--url", "ftp://x"]) == 2
    assert "url" in capsys.readouterr().err
    assert cli_main(["run", "--topic", "a", "--url", "https://r/h", "--header", "nocolon"]) == 2
    assert "NAME: VALUE" in capsys.readouterr().err
    monkeypatch.setenv("REFOLD_WEBHOOKS__TOPICS", "a,b")
    monkeypatch.setenv("REFOLD_WEBHOOKS__MAX_ATTEMPTS", "zero")
    assert cli_main(["run", "--url", "https://r/h"]) == 2
    assert "max_attempts" in capsys.readouterr().err


def test_log_entries_read_back_as_written():
    entry = LogEntry("k|t/1@2.0", "t", 1, 2, "failed", 503, 12, 1.25, 3000.5, 1_700_000_000_000)
    entry = dataclasses.replace(entry, reason="webhook-failed", error="HTTP 503", run="redrive")
    flat = entry.flat()
    raw = {k.encode(): v.encode() for k, v in zip(flat[::2], flat[1::2], strict=True)}
    back = LogEntry.from_stream(b"1-0", raw)
    assert back == dataclasses.replace(entry, latency_ms=1.2, elapsed_ms=3000.5, entry_id="1-0")
    assert LogEntry.from_stream("2-0", {b"status": b"retry", b"extra": b"x"}).status == "retry"


def test_the_cli_merges_the_environment_and_its_options(monkeypatch):
    from refold.deploy.webhooks_cli import _settings as cli_settings
    from refold.services.webhooks.config import WebhookServiceSettings

    monkeypatch.setenv("REFOLD_WEBHOOKS__URL", "https://r.example/h")
    monkeypatch.setenv("REFOLD_WEBHOOKS__TOPICS", "a.insights,b.insights")
    monkeypatch.setenv("REFOLD_WEBHOOKS__HEADERS", '{"Authorization": "Bearer e"}')
    monkeypatch.setenv("REFOLD_WEBHOOKS__SEVERITIES", "critical,warning")
    args = build_parser().parse_args(["run", "--concurrency", "3", "--header", "X-A: 1"])
    settings = cli_settings(args, WebhookServiceSettings(), "dispatch")
    assert settings.topics == ("a.insights", "b.insights")
    assert settings.severities == ("critical", "warning")
    assert settings.concurrency == 3
    assert {k: v.get_secret_value() for k, v in settings.headers.items()} == {
        "Authorization": "Bearer e",
        "X-A": "1",
    }
    args = build_parser().parse_args(["run", "--severity", "any", "--topic", "c"])
    settings = cli_settings(args, WebhookServiceSettings(), "dispatch")
    assert (settings.severities, settings.topics) == ((), ("c",))


def test_progress_is_logged_once_a_period_and_never_while_idle():
    progress = ProgressReport(10.0, now=0.0)
    assert progress.due(delivered=5, settled=5, now=3.0) is None  # too soon
    assert progress.due(delivered=5, settled=5, now=10.0) == 0.5  # 5 delivered in 10 s
    idle = [progress.due(delivered=5, settled=5, now=10.0 + 10 * i) for i in range(1, 40)]
    assert idle == [None] * 39  # the 39 "delivered 5 (0/s)" lines of an idle dispatcher
    assert progress.due(delivered=5, settled=6, now=410.0) == 0.0  # a retry is activity too
    assert progress.due(delivered=25, settled=26, now=412.0) is None
    assert progress.due(delivered=25, settled=26, now=420.0) == 2.0  # the rate of the period
