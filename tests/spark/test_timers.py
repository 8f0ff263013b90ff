"""Entity folds with timers on real Spark: session windows and a stream-stream join.

web_sessions (two co-partitioned topics) and search_ctr run in one application through a kill -9;
their states and aggregates equal the plain-Python oracle, every visit the oracle closed was
emitted at least once, and a replay with other batch sizes rebuilds the same state.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import orjson

from refold.contracts.process_group import GroupProcess
from refold.contracts.processors import ProcessLauncher, ProcessorOptions
from refold.contracts.registry import processor_spec
from refold.contracts.settings import KafkaSettings, RedisSettings, SparkSettings
from refold.contracts.store.connect import redis_client
from refold.contracts.store.generations import GenerationRegistry
from refold.contracts.web import PAGEVIEWS, SEARCHES
from refold.deploy.simulators.clickstream import ClickstreamSimulator
from refold.processors.fold.oracle import fold_timed
from refold.processors.search_ctr.config import SEARCH_CTR
from refold.processors.search_ctr.projection import SearchCtrProjection, ctr
from refold.processors.web_sessions.config import WEB_SESSIONS, WebSessionsOptions
from refold.processors.web_sessions.projection import WebSessionsProjection
from refold.replay.plan import ToEarliest
from refold.replay.rebuild import plan_replay, run_rebuild
from refold.services.producer.publisher import EventPublisher
from refold.services.reader.state_reader import StateReader
from tests.support.topics import read_to_end
from tests.support.waiting import assert_eventually
from tests.support.windows import timed_input


def _closed(bootstrap: str, topic: str) -> set[tuple]:
    return {tuple(sorted(orjson.loads(m.value()).items())) for m in read_to_end(bootstrap, topic)}


def test_sessions_and_the_search_join_equal_their_oracles_through_a_kill_and_a_replay(
    kafka_bootstrap, redis_url, make_topic, unique, tmp_path: Path
):
    pageviews = make_topic(partitions=PAGEVIEWS.partitions, prefix="pageviews")
    searches = make_topic(partitions=SEARCHES.partitions, prefix="searches")
    closed = make_topic(partitions=4, prefix="visits")
    kafka = KafkaSettings(bootstrap_servers=kafka_bootstrap)
    redis_settings = RedisSettings(url=redis_url, key_prefix=f"test-{unique}")

    def options(batch: int) -> dict:
        return {
            "web_sessions": WebSessionsOptions(
                topics=[pageviews, searches],
                dead_letter_topic=make_topic(partitions=1, prefix="dlq"),
                closed_topic=closed,
                max_offsets_per_trigger=batch,
            ),
            "search_ctr": ProcessorOptions(
                topics=[searches],
                dead_letter_topic=make_topic(partitions=1, prefix="dlq"),
                max_offsets_per_trigger=batch,
            ),
        }

    launcher = ProcessLauncher(kafka, redis_settings, SparkSettings(), tmp_path, options(1_000))
    publisher = EventPublisher(
        kafka,
        topics=[
            dataclasses.replace(PAGEVIEWS, name=pageviews),
            dataclasses.replace(SEARCHES, name=searches),
        ],
    )
    web = [
        e
        for e in ClickstreamSimulator(900, seed=4, late_rate=0.04, long_gap_rate=0.2)
        if e[0] in ("PageViewed", "SearchPerformed", "SearchResultClicked")
    ]
    client = redis_client(redis_url)
    names = ["web_sessions", "search_ctr"]
    registries = {n: GenerationRegistry.of(client, n, redis_settings.key_prefix) for n in names}

    def applied(name: str) -> int:
        live = registries[name].live()
        return 0 if live is None else sum(registries[name].positions(live)[0].values())

    half = len(web) // 2
    publisher.emit_many(web[:half])
    process = GroupProcess(launcher.argv(names), launcher.env(), tmp_path / "run-1.log").start()
    processes = [process]
    try:
        assert_eventually(
            lambda: applied("web_sessions") > 0 and applied("search_ctr") > 0,
            timeout=240,
            alive=process.alive,
            message=process.log_tail,
        )
        publisher.emit_many(web[half:])
        process.kill()  # kill -9 with records still to fold and timers to fire
        process = GroupProcess(launcher.argv(names), launcher.env(), tmp_path / "run-2.log").start()
        processes.append(process)

        sessions = fold_timed(
            WebSessionsProjection(closed_topic=closed),
            WEB_SESSIONS.event_time,
            (pageviews, searches),
            timed_input(kafka_bootstrap, pageviews, searches),
        )
        join = fold_timed(
            SearchCtrProjection(),
            SEARCH_CTR.event_time,
            (searches,),
            timed_input(kafka_bootstrap, searches),
        )
        readers = {n: StateReader(client, n, redis_settings.key_prefix) for n in names}
        expected = {
            "web_sessions": ("visits", "visit_totals", sessions),
            "search_ctr": ("search_buffers", "ctr", join),
        }
        for name, (table, aggregate, oracle) in expected.items():
            assert_eventually(
                lambda n=name, t=table, o=oracle: dict(readers[n].scan(t)) == o.states,
                timeout=300,
                alive=process.alive,
                message=process.log_tail,
            )
            assert readers[name].aggregate(aggregate).value == dict(oracle.aggregate)
        assert sessions.aggregate["closed"] > 0
        assert sessions.late, "late events were judged"
        rates = ctr(readers["search_ctr"].aggregate("ctr").value)
        assert sum(s for s, _c, _r in rates.values()) > 100

        # Every visit the oracle closed was emitted at least once (a kill may repeat some).
        want = {tuple(sorted(e.value.items())) for e in sessions.effects}
        assert want
        assert_eventually(
            lambda: want <= _closed(kafka_bootstrap, closed),
            timeout=60,
            alive=process.alive,
            message=process.log_tail,
        )

        # replay --to-earliest with other batch sizes: the same state.
        process.stop()
        name = "web_sessions"
        first = registries[name].live()
        small = ProcessLauncher(kafka, redis_settings, SparkSettings(), tmp_path, options(400))
        spec = processor_spec(name)
        plan = plan_replay(spec, ToEarliest(), kafka, client, redis_settings.key_prefix)
        assert plan.ready, plan.render()
        rebuilt = run_rebuild(plan, spec, kafka, redis_settings, state_dir=tmp_path, launcher=small)
        assert rebuilt.previous == first
        assert dict(readers[name].scan("visits")) == sessions.states
        assert readers[name].aggregate("visit_totals").value == dict(sessions.aggregate)
    finally:
        for running in processes:
            running.stop()
        publisher.close()
