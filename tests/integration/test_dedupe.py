"""De-duplication by event id in the writer (issue 22 item 2), against real Redis.

The same events land in the log twice (a producer retrying from a new process, a range copied
again): within one batch, across batches, and long after. With ``dedupe=EventId()`` the live
generation, a rebuild folding the log in one batch, and the oracle with the same rule agree,
and equal the oracle of the distinct events.
"""

from __future__ import annotations

import dataclasses
import zlib

from refold.contracts.codec import EventCodec
from refold.contracts.processors import EventId
from refold.contracts.store.connect import redis_client
from refold.deploy.simulators.orders import OrderSimulator
from refold.processors.fold.oracle import fold_all
from refold.processors.fold.records import SourceRecord
from refold.processors.order_state.projection import OrderStateProjection
from refold.processors.runtime.envelope import FoldTarget, FoldWriter
from refold.services.reader.state_reader import StateReader

PARTITIONS = 3


def _log(events) -> list[SourceRecord]:
    codec = EventCodec()
    offsets = [0] * PARTITIONS
    out = []
    for event_type, event in events:
        partition = zlib.crc32(event["order_id"].encode()) % PARTITIONS
        value = codec.encode(event_type, event)
        out.append(SourceRecord("orders", partition, offsets[partition], b"", value))
        offsets[partition] += 1
    return sorted(out, key=lambda r: (r.partition, r.offset))


def test_duplicated_events_fold_once_live_on_rebuild_and_in_the_oracle(
    target: FoldTarget, redis_url
):
    projection = OrderStateProjection()
    events = list(OrderSimulator(300, seed=8, anomaly_rate=0))
    # Every 5th event twice in a row, and a stretch of the log produced again at the end.
    log = [e for n, e in enumerate(events) for _ in range(2 if n % 5 == 0 else 1)]
    log += events[200:320]
    records = _log(log)
    dedupe = EventId(horizon=500)
    live = dataclasses.replace(target, dedupe=dedupe, check_keys=False)
    writer = FoldWriter(live, projection)
    batches = [records[i : i + 173] for i in range(0, len(records), 173)]
    duplicates = sum(writer.apply(batch, batch_id=n).duplicates for n, batch in enumerate(batches))
    rebuild = dataclasses.replace(live, generation=2)
    in_one = FoldWriter(rebuild, projection).apply(records, batch_id=0)

    expected = fold_all(projection, log, dedupe=dedupe)
    assert expected.states == fold_all(projection, events).states  # no id forgotten here
    assert duplicates == in_one.duplicates == expected.duplicates == len(log) - len(events)
    reader = StateReader(redis_client(redis_url), "order_state", target.key_prefix)
    for generation in (1, 2):
        assert dict(reader.scan("orders", generation=generation)) == expected.states
        totals = reader.aggregate("order_totals", generation=generation).value
        assert totals == dict(expected.aggregate)
