"""Window processors on real Spark: sales_windows and unique_visitors in one application.

Through a kill -9 while windows close, the buckets equal the plain-Python oracle (nothing counted
twice), every window the watermark passed is emitted at least once with its final result, the
HyperLogLog counts stay within 2% of the exact distinct counts, and a replay with other batch
sizes rebuilds identical buckets and sketches while emitting nothing the live generation had
emitted.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from pathlib import Path

from refold.contracts.codec import EventCodec
from refold.contracts.commerce import ORDERS
from refold.contracts.layout import StateLayout
from refold.contracts.process_group import GroupProcess
from refold.contracts.processors import ProcessLauncher, ProcessorOptions
from refold.contracts.registry import processor_spec
from refold.contracts.settings import KafkaSettings, RedisSettings, SparkSettings
from refold.contracts.store.connect import redis_client
from refold.contracts.store.generations import GenerationRegistry
from refold.contracts.web import PAGEVIEWS
from refold.contracts.windows import result_from_record
from refold.deploy.simulators.clickstream import ClickstreamSimulator
from refold.deploy.simulators.orders import OrderSimulator
from refold.processors.fold.oracle import WindowOracle, fold_windows
from refold.processors.fold.windows import WindowFold
from refold.processors.runtime.window_store import WindowCloser, generation_watermark
from refold.processors.sales_windows.config import SALES_WINDOWS
from refold.processors.sales_windows.projection import SalesWindows
from refold.processors.unique_visitors.config import UNIQUE_VISITORS
from refold.processors.unique_visitors.projection import UniqueVisitors
from refold.replay.plan import ToEarliest
from refold.replay.rebuild import plan_replay, run_rebuild
from refold.services.producer.publisher import EventPublisher
from tests.support.topics import read_to_end
from tests.support.waiting import assert_eventually
from tests.support.windows import bucket_dump, log_events, sketch_counts

FOLDS: dict[str, WindowFold] = {
    "sales_windows": SalesWindows(),
    "unique_visitors": UniqueVisitors(),
}
SPECS = {"sales_windows": SALES_WINDOWS, "unique_visitors": UNIQUE_VISITORS}


def _result(value: bytes) -> dict:
    """A closed window's result as emitted (a WindowResult record), in result_of's shape."""
    return result_from_record(EventCodec().decode(value).data)


def _emitted(bootstrap: str, topic: str) -> list[tuple[dict, dict]]:
    """Every result on a windows topic, with its headers, in partition order."""
    return [
        (_result(m.value()), {k: v.decode() for k, v in m.headers()})
        for m in read_to_end(bootstrap, topic)
    ]


def _final_results(emitted: list[tuple[dict, dict]]) -> dict[tuple[str, str, int], dict]:
    """The last result emitted per window (a correction replaces what came before)."""
    return {(r["window"], r["group"], r["end"]): r for r, _h in emitted}


def test_windows_equal_their_oracles_through_a_kill_and_a_replay(
    kafka_bootstrap, redis_url, make_topic, unique, tmp_path: Path
):
    orders = make_topic(partitions=ORDERS.partitions, prefix="orders")
    pageviews = make_topic(partitions=PAGEVIEWS.partitions, prefix="pageviews")
    results = {name: make_topic(partitions=4, prefix=f"{name}-out") for name in FOLDS}
    kafka = KafkaSettings(bootstrap_servers=kafka_bootstrap)
    redis_settings = RedisSettings(url=redis_url, key_prefix=f"test-{unique}")

    def options(batch: int) -> dict[str, ProcessorOptions]:
        return {
            name: ProcessorOptions(
                topics=[orders if name == "sales_windows" else pageviews],
                dead_letter_topic=make_topic(partitions=1, prefix="dlq"),
                windows_topic=results[name],
                max_offsets_per_trigger=batch,
            )
            for name in FOLDS
        }

    launcher = ProcessLauncher(kafka, redis_settings, SparkSettings(), tmp_path, options(1_500))
    publisher = EventPublisher(
        kafka,
        topics=[
            dataclasses.replace(ORDERS, name=orders),
            dataclasses.replace(PAGEVIEWS, name=pageviews),
        ],
    )
    simulator = OrderSimulator(1_500, seed=12)
    order_events = list(simulator)
    views = [
        e
        for e in ClickstreamSimulator(700, seed=12, late_rate=0.03, sessions_per_second=0.1)
        if e[0] == "PageViewed"
    ]
    client = redis_client(redis_url)
    registries = {n: GenerationRegistry.of(client, n, redis_settings.key_prefix) for n in FOLDS}

    def closed() -> int:
        return len(_emitted(kafka_bootstrap, results["sales_windows"]))

    half_o, half_v = len(order_events) // 2, len(views) // 2
    publisher.emit_many(order_events[:half_o])
    publisher.emit_many(views[:half_v])
    names = list(FOLDS)
    process = GroupProcess(launcher.argv(names), launcher.env(), tmp_path / "run-1.log").start()
    processes = [process]
    try:
        assert_eventually(
            lambda: closed() > 0, timeout=240, alive=process.alive, message=process.log_tail
        )
        publisher.emit_many(order_events[half_o:])
        process.kill()  # kill -9 while windows close, with records still to fold
        publisher.emit_many(views[half_v:])
        process = GroupProcess(launcher.argv(names), launcher.env(), tmp_path / "run-2.log").start()
        processes.append(process)

        oracles: dict[str, WindowOracle] = {
            "sales_windows": fold_windows(
                FOLDS["sales_windows"],
                SALES_WINDOWS.event_time,
                log_events(kafka_bootstrap, orders),
            ),
            "unique_visitors": fold_windows(
                FOLDS["unique_visitors"],
                UNIQUE_VISITORS.event_time,
                log_events(kafka_bootstrap, pageviews),
            ),
        }

        def live_keys(name: str):
            live = registries[name].live()
            return None if live is None else registries[name].keys(live)

        for name, oracle in oracles.items():
            assert_eventually(
                lambda n=name, o=oracle: (
                    live_keys(n) is not None and bucket_dump(client, live_keys(n)) == o.buckets
                ),
                timeout=300,
                alive=process.alive,
                message=process.log_tail,
            )
        assert oracles["unique_visitors"].late, "the clickstream had late page views"
        # HyperLogLog against the exact distinct counts (hours with enough visitors to say).
        sketches = sketch_counts(client, live_keys("unique_visitors"))
        exact = {k: len(v) for k, v in oracles["unique_visitors"].distinct.items()}
        assert set(sketches) == set(exact)
        big = [k for k, n in exact.items() if n >= 200]
        assert big
        errors = [abs(sketches[k] - exact[k]) / exact[k] for k in big]
        assert max(errors) < 0.02, errors

        # Every window the watermark passed was emitted at least once, its last result final.
        for name, oracle in oracles.items():
            fold, spec = FOLDS[name], SPECS[name]
            closer = WindowCloser(
                StateLayout(name, redis_settings.key_prefix),
                registries[name].live(),
                fold,
                spec.event_time.lateness_ms,
                redis_url,
                {"bootstrap.servers": kafka_bootstrap},
            )
            watermark = closer.watermark()
            windows = {w.name: w for w in fold.windows}
            due = {
                (w, g, end)
                for (w, start, g) in oracle.buckets
                for end in windows[w].ends(start)
                if end <= watermark and windows[w].emit
            }
            assert_eventually(
                lambda n=name, d=due: (
                    d <= set(_final_results(_emitted(kafka_bootstrap, results[n])))
                ),
                timeout=120,
                alive=process.alive,
                message=process.log_tail,
            )
            finals = _final_results(_emitted(kafka_bootstrap, results[name]))
            for key in due:
                got = finals[key]
                want = oracle.window(windows[key[0]], key[2], key[1])
                if fold.distinct:  # estimates: compared with the exact counts above
                    got = {k: v for k, v in got.items() if not k.startswith("distinct:")}
                    want = {k: v for k, v in want.items() if not k.startswith("distinct:")}
                assert got == want, key

        # replay --to-earliest with other batch sizes: identical buckets and sketches, and
        # nothing emitted that the live generation had emitted already.
        process.stop()
        name = "sales_windows"
        first = registries[name].live()
        before = _emitted(kafka_bootstrap, results[name])
        closed = {(r["window"], r["group"], r["end"]) for r, _h in before}
        small = ProcessLauncher(kafka, redis_settings, SparkSettings(), tmp_path, options(700))
        spec = processor_spec(name)
        plan = plan_replay(spec, ToEarliest(), kafka, client, redis_settings.key_prefix)
        assert plan.ready, plan.render()
        rebuilt = run_rebuild(plan, spec, kafka, redis_settings, state_dir=tmp_path, launcher=small)
        assert rebuilt.previous == first
        old, new = registries[name].keys(first), registries[name].keys(rebuilt.generation)
        assert bucket_dump(client, new) == bucket_dump(client, old) == oracles[name].buckets
        assert sketch_counts(client, new) == sketch_counts(client, old)
        after = _emitted(kafka_bootstrap, results[name])
        # The rebuilt generation emits no window the live one emitted. It closes only those the
        # live process had not closed yet when it stopped (its closer runs beside its batches),
        # each with the oracle's result.
        fresh = [r for r, _h in after if (r["window"], r["group"], r["end"]) not in closed]
        seen = Counter((r["window"], r["group"], r["end"]) for r, _h in before)
        again = [
            (r["window"], r["group"], r["end"], h.get("refold.generation"))
            for r, h in after
            if (r["window"], r["group"], r["end"]) in closed
        ]
        again = [a for a in again if Counter(x[:3] for x in again)[a[:3]] > seen[a[:3]]]
        assert len(after) == len(before) + len(fresh), (
            f"a window was emitted again: {again[:10]}; the live generation's watermark "
            f"{generation_watermark(client, old, SPECS[name].event_time.lateness_ms)}"
        )
        windows = {w.name: w for w in FOLDS[name].windows}
        for result in fresh:
            want = oracles[name].window(windows[result["window"]], result["end"], result["group"])
            exact = {k: v for k, v in result.items() if not k.startswith("distinct:")}
            assert exact == {k: v for k, v in want.items() if not k.startswith("distinct:")}
    finally:
        for running in processes:
            running.stop()
        publisher.close()
