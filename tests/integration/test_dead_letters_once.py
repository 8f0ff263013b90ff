"""Dead letters once (issue 22 item 3): a rebuild does not send the live generation's again.

Real Redis and a real broker, the processor's writer without Spark: a live generation folds
part of a log with bad records, a rebuild folds all of it, then a rebuild with stricter code.
The dead-letter topic must hold each (origin, reason) once, and a new reason once.
"""

from __future__ import annotations

import dataclasses
import json
import zlib
from collections import Counter

from refold.contracts.codec import EventCodec
from refold.contracts.store.connect import redis_client
from refold.contracts.store.generations import GenerationRegistry
from refold.deploy.cli import main as refold_main
from refold.deploy.simulators.orders import OrderSimulator
from refold.processors.fold.projection import EventRejectedError, State
from refold.processors.fold.records import SourceRecord
from refold.processors.order_state.projection import OrderStateProjection
from refold.processors.runtime.envelope import FoldTarget, FoldWriter
from tests.support.dead_letters import dlq_letters

PARTITIONS = 2


class StricterOrderState(OrderStateProjection):
    """New code: refuses shipments of orders over 5 lines (a rule the old code did not have)."""

    def apply(self, state: State | None, event_type: str, event: dict) -> State:  # type: ignore[override]
        if event_type == "OrderShipped" and state is not None and len(state["lines"]) > 5:
            msg = "ships at most 5 lines"
            raise EventRejectedError(msg)
        return super().apply(state, event_type, event)


def _records() -> list[SourceRecord]:
    codec = EventCodec()
    offsets = [0] * PARTITIONS
    out = []
    events = list(OrderSimulator(300, seed=9, anomaly_rate=0.05))
    for n, (event_type, event) in enumerate(events):
        partition = zlib.crc32(event["order_id"].encode()) % PARTITIONS
        value = b"not avro" if n % 97 == 0 else codec.encode(event_type, event)
        key = event["order_id"].encode()
        out.append(SourceRecord("orders", partition, offsets[partition], key, value))
        offsets[partition] += 1
    return sorted(out, key=lambda r: (r.partition, r.offset))


def test_a_rebuild_sends_each_dead_letter_once_and_a_new_reason_once(
    target: FoldTarget, redis_url, kafka_bootstrap, monkeypatch, capsys
):
    records = _records()
    first, second, third = (dataclasses.replace(target, generation=g) for g in (1, 2, 3))
    client = redis_client(redis_url)
    registry = GenerationRegistry.of(client, "order_state", target.key_prefix)
    assert registry.create({"topics": ["orders"]}, live=True) == 1

    # Live: two thirds of the log. Each partition's first two thirds.
    head = [
        r for r in records if r.offset < 2 * sum(x.partition == r.partition for x in records) // 3
    ]
    old = OrderStateProjection()
    FoldWriter(first, old).apply(head, batch_id=0)
    by_live = dlq_letters(kafka_bootstrap, target.dlq_topic)
    reasons = Counter(reason for _p, _o, reason, _g in by_live)
    assert reasons["bad-magic"] > 0  # the premise: both kinds of bad record
    assert reasons["rejected"] > 0

    # A rebuild with the same code, of the whole log: only the tail's letters are new.
    assert registry.create({"topics": ["orders"], "replay_of": 1}) == 2
    outcome = FoldWriter(second, old).apply(records, batch_id=0)
    after_rebuild = dlq_letters(kafka_bootstrap, target.dlq_topic)
    new = after_rebuild[len(by_live) :]
    assert outcome.suppressed_letters == len(by_live)
    assert {(p, o) for p, o, _r, _g in new}.isdisjoint({(p, o) for p, o, _r, _g in by_live})
    assert all(g == 2 for *_rest, g in new)
    origins = Counter((p, o, r) for p, o, r, _g in after_rebuild)
    assert max(origins.values()) == 1  # each (origin, reason) once
    registry.flip(2)

    # A rebuild with stricter code: only the letters of its new rule are sent.
    assert registry.create({"topics": ["orders"], "replay_of": 2}) == 3
    stricter = FoldWriter(third, StricterOrderState()).apply(records, batch_id=0)
    after_stricter = dlq_letters(kafka_bootstrap, target.dlq_topic)
    newest = after_stricter[len(after_rebuild) :]
    assert newest, "the premise: the new rule refuses some shipments"
    assert {r for *_po, r, _g in newest} == {"rejected"}
    assert all(g == 3 for *_rest, g in newest)
    assert stricter.suppressed_letters == len(after_rebuild)
    assert max(Counter((p, o, r) for p, o, r, _g in after_stricter).values()) == 1

    # `refold dlq list`: what each generation decided, by reason.
    monkeypatch.setenv("REFOLD_REDIS__URL", redis_url)
    monkeypatch.setenv("REFOLD_REDIS__KEY_PREFIX", target.key_prefix)
    capsys.readouterr()
    assert refold_main(["dlq", "list", "--processor", "order_state", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert listed["topic"] == "order_state.dlq"  # no option: the default name
    assert (listed["generation"], listed["status"]) == (2, "live")
    assert listed["letters"] == len(after_rebuild)  # everything it decided, sent or not
    by_reason = {r["reason"]: r["count"] for r in listed["reasons"]}
    assert by_reason == dict(Counter(r for *_po, r, _g in after_rebuild))
    # The processor's dead_letter_topic option names the topic its letters went to.
    monkeypatch.setenv("REFOLD_ORDER_STATE__DEAD_LETTER_TOPIC", target.dlq_topic)
    assert refold_main(["dlq", "list", "--processor", "order_state", "--generation", "3"]) == 0
    table = capsys.readouterr().out
    assert f"generation 3 (building): {len(after_stricter)} dead letter(s)" in table
    assert f"refold tail {target.dlq_topic})" in table
