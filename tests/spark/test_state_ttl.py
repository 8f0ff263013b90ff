"""State that expires on real Spark: live == oracle through a kill -9, and a replay == oracle.

The fold (tests/support/expiring.py) is a user's package here: a site directory registers its
spec under ``refold.processors`` for the processor processes, as an installed package would.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from refold.contracts.process_group import GroupProcess
from refold.contracts.processors import ProcessLauncher, ProcessorOptions
from refold.contracts.settings import KafkaSettings, RedisSettings, SparkSettings
from refold.contracts.store.connect import redis_client
from refold.contracts.store.generations import GenerationRegistry
from refold.contracts.store.stats import ProcessorStats
from refold.contracts.web import PAGEVIEWS
from refold.deploy.simulators.clickstream import ClickstreamSimulator
from refold.processors.fold.oracle import fold_timed
from refold.replay.plan import ToEarliest
from refold.replay.rebuild import plan_replay, run_rebuild
from refold.services.producer.publisher import EventPublisher
from refold.services.reader.state_reader import StateReader
from tests.support import expiring
from tests.support.expiring import EVENT_TIME, NAME, TTL, ExpiringPages
from tests.support.waiting import assert_eventually
from tests.support.windows import timed_input


def _site(site: Path) -> None:
    """The fold as an installed package: a module and a dist-info naming its spec."""
    site.mkdir()
    source = Path(expiring.__file__).read_text()
    module = source.replace("tests.support.expiring:build", "expiring_site:build")
    (site / "expiring_site.py").write_text(module)
    dist = site / "expiring_site-0.1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: expiring-site\nVersion: 0.1.0\n")
    (dist / "entry_points.txt").write_text(
        f"[refold.processors]\n{NAME} = expiring_site:EXPIRING_PAGES\n"
    )


def test_expiring_sessions_equal_the_oracle_through_a_kill_and_a_replay(
    kafka_bootstrap, redis_url, make_topic, unique, tmp_path: Path, monkeypatch
):
    _site(tmp_path / "site")
    path = os.pathsep.join(p for p in (str(tmp_path / "site"), os.environ.get("PYTHONPATH")) if p)
    monkeypatch.setenv("PYTHONPATH", path)  # the processes' (GroupProcess adds os.environ)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    pageviews = make_topic(partitions=PAGEVIEWS.partitions, prefix="pageviews")
    kafka = KafkaSettings(bootstrap_servers=kafka_bootstrap)
    redis_settings = RedisSettings(url=redis_url, key_prefix=f"test-{unique}")
    dlq = make_topic(partitions=1, prefix="dlq")

    def launcher(batch: int) -> ProcessLauncher:
        options = ProcessorOptions(
            topics=[pageviews], dead_letter_topic=dlq, max_offsets_per_trigger=batch
        )
        return ProcessLauncher(kafka, redis_settings, SparkSettings(), tmp_path, {NAME: options})

    publisher = EventPublisher(kafka, topics=[dataclasses.replace(PAGEVIEWS, name=pageviews)])
    views = [
        e
        for e in ClickstreamSimulator(600, seed=8, late_rate=0.03, long_gap_rate=0.4)
        if e[0] == "PageViewed"
    ]
    client = redis_client(redis_url)
    registry = GenerationRegistry.of(client, NAME, redis_settings.key_prefix)
    reader = StateReader(client, NAME, redis_settings.key_prefix)

    def applied() -> int:
        live = registry.live()
        return 0 if live is None else sum(registry.positions(live)[0].values())

    first = launcher(400)
    half = len(views) // 2
    publisher.emit_many(views[:half])
    process = GroupProcess(first.argv([NAME]), first.env(), tmp_path / "run-1.log").start()
    processes = [process]
    try:
        assert_eventually(
            lambda: applied() > 0, timeout=240, alive=process.alive, message=process.log_tail
        )
        publisher.emit_many(views[half:])
        process.kill()  # kill -9 with records still to fold and expiries to fire
        process = GroupProcess(first.argv([NAME]), first.env(), tmp_path / "run-2.log").start()
        processes.append(process)

        oracle = fold_timed(
            ExpiringPages(),
            EVENT_TIME,
            (pageviews,),
            timed_input(kafka_bootstrap, pageviews),
            state_ttl=TTL,
        )
        assert oracle.expired > 20, oracle.expired
        assert_eventually(
            lambda: dict(reader.scan("sessions")) == oracle.states,
            timeout=300,
            alive=process.alive,
            message=process.log_tail,
        )
        assert reader.aggregate("page_totals").value == dict(oracle.aggregate)
        live = registry.live()
        assert ProcessorStats(client, registry.layout).read(live).expired == oracle.expired

        # replay --to-earliest with other batch sizes: the same state, the same expiries.
        process.stop()
        spec = dataclasses.replace(expiring.EXPIRING_PAGES, topics=(pageviews,))
        plan = plan_replay(spec, ToEarliest(), kafka, client, redis_settings.key_prefix)
        assert plan.ready, plan.render()
        rebuilt = run_rebuild(
            plan, spec, kafka, redis_settings, state_dir=tmp_path, launcher=launcher(150)
        )
        assert rebuilt.previous == live
        assert dict(reader.scan("sessions")) == oracle.states
        assert reader.aggregate("page_totals").value == dict(oracle.aggregate)
        stats = ProcessorStats(client, registry.layout).read(registry.live())
        assert stats.expired == oracle.expired
    finally:
        for running in processes:
            running.stop()
        publisher.close()
