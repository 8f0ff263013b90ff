"""A stream-table join in Spark: clicks that wait for customer_profiles' watermark are joined as
soon as the table moves on, with no click after them, and equal the oracle.

customer_profiles and enriched_clicks run as two queries of one Spark application. Every click
is in the log first: enriched_clicks folds them all into its pending set and goes idle (no
record left), with nothing joined, since the table has no watermark yet. Then the account events
are produced. Only the joiner's idle rounds can join the clicks now (before them, an idle lookup
processor joined its waiting events only at its next record); what they join must be what the
oracle joins over the table's final versions and watermark.
"""

from __future__ import annotations

from pathlib import Path

from refold.contracts.codec import EventCodec
from refold.contracts.layout import StateLayout, position_field
from refold.contracts.process_group import GroupProcess
from refold.contracts.processors import ProcessLauncher, ProcessorOptions
from refold.contracts.settings import KafkaSettings, RedisSettings, SparkSettings
from refold.contracts.store.connect import redis_client
from refold.contracts.store.generations import GenerationRegistry
from refold.contracts.web import CUSTOMERS, SEARCHES
from refold.contracts.windows import watermark_of
from refold.deploy.simulators.clickstream import ClickstreamSimulator
from refold.deploy.simulators.orders import customer_id
from refold.processors.customer_profiles.config import (
    CUSTOMER_PROFILES,
    CustomerProfilesOptions,
)
from refold.processors.customer_profiles.projection import CustomerProfilesProjection
from refold.processors.enriched_clicks.config import ENRICHED_CLICKS
from refold.processors.enriched_clicks.projection import EnrichedClicksProjection
from refold.processors.fold.lookups import PENDING_TIMERS
from refold.processors.fold.oracle import fold_lookups, fold_timed
from refold.services.reader.state_reader import StateReader
from tests.support.topics import publish, source_records
from tests.support.waiting import assert_eventually

CODEC = EventCodec()
CRM_TYPES = set(CUSTOMERS.event_types)


def _decoded(records):
    for r in records:
        event = CODEC.decode(r.value)
        yield r.topic, r.partition, r.offset, event.event_type, event.data


def test_waiting_clicks_are_joined_when_the_table_moves_with_no_click_after_them(
    kafka_bootstrap, redis_url, make_topic, unique, tmp_path: Path
):
    searches = make_topic(partitions=SEARCHES.partitions, prefix="searches")
    crm = make_topic(partitions=CUSTOMERS.partitions, prefix="crm")
    kafka = KafkaSettings(bootstrap_servers=kafka_bootstrap)
    prefix = f"test-{unique}"
    launcher = ProcessLauncher(
        kafka,
        RedisSettings(url=redis_url, key_prefix=prefix),
        SparkSettings(),
        tmp_path,
        {
            "customer_profiles": CustomerProfilesOptions(
                topics=[crm], dead_letter_topic=make_topic(partitions=1, prefix="dlq")
            ),
            "enriched_clicks": ProcessorOptions(
                topics=[searches], dead_letter_topic=make_topic(partitions=1, prefix="dlq")
            ),
        },
    )
    customers = tuple(customer_id(n) for n in range(1, 80))
    events = list(
        ClickstreamSimulator(
            500, seed=13, customer_ids=customers, customer_share=0.6, late_rate=0.02
        )
    )
    publish(
        kafka_bootstrap, SEARCHES, searches, [e for e in events if e[0] in SEARCHES.event_types]
    )
    clicks, ends = source_records(kafka_bootstrap, searches, SEARCHES.partitions)
    client = redis_client(redis_url)
    registry = GenerationRegistry.of(client, "enriched_clicks", prefix)
    reader = StateReader(client, "enriched_clicks", prefix)

    def clicks_applied() -> bool:
        live = registry.live()
        positions = {} if live is None else registry.positions(live)[0]
        return all(positions.get(tp, 0) >= end for tp, end in ends.items())

    process = GroupProcess(
        launcher.argv(["customer_profiles", "enriched_clicks"]),
        launcher.env(),
        tmp_path / "logs" / "processors.log",
    ).start()
    try:
        assert_eventually(
            clicks_applied, timeout=240, alive=process.alive, message=process.log_tail
        )
        pending = StateLayout("enriched_clicks", prefix).generation(reader.live_generation())
        waiting = client.zcard(pending.timers(PENDING_TIMERS))
        assert waiting > 50
        assert reader.aggregate("clicks_by_customer").value == {}  # no table watermark yet

        publish(kafka_bootstrap, CUSTOMERS, crm, [e for e in events if e[0] in CRM_TYPES])
        table, _ = source_records(kafka_bootstrap, crm, CUSTOMERS.partitions)
        profiles = fold_timed(
            CustomerProfilesProjection(), CUSTOMER_PROFILES.event_time, (crm,), _decoded(table)
        )
        partitions = [position_field(crm, p) for p in range(CUSTOMERS.partitions)]
        expected = fold_lookups(
            EnrichedClicksProjection(),
            ENRICHED_CLICKS.event_time,
            _decoded(clicks),
            profiles.states,
            watermark_of(profiles.clocks, CUSTOMER_PROFILES.event_time.lateness_ms, partitions),
        )
        assert expected.aggregate["clicks"] > 50  # the table's watermark passes most clicks
        assert_eventually(
            lambda: reader.aggregate("clicks_by_customer").value == dict(expected.aggregate),
            timeout=180,
            alive=process.alive,
            message=process.log_tail,
        )
        assert client.zcard(pending.timers(PENDING_TIMERS)) == expected.waiting
        assert clicks_applied()  # and no click came after: the idle rounds joined them
    finally:
        process.stop()
