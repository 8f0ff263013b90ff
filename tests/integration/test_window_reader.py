"""WindowReader and ``replay diff`` on window buckets written by the real bucket writes.

Buckets are written with :func:`write_windows` (the envelope's window writes) from deltas of
:meth:`WindowDelta.add`, in several transactions as several partitions' tasks would; every read
is compared with the oracle (:func:`fold_windows`) over the same records. Distinct counts are
HyperLogLog estimates, compared with the oracle's exact counts within the sketch's error.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
import redis
from fastapi.testclient import TestClient

from refold.contracts.layout import GenerationKeys, StateLayout
from refold.contracts.processors import EventTime
from refold.contracts.settings import RedisSettings
from refold.contracts.store.connect import redis_client
from refold.contracts.store.generations import GenerationRegistry
from refold.contracts.windows import window_meta
from refold.processors.fold.eventtime import event_time_ms
from refold.processors.fold.oracle import WindowOracle, fold_windows
from refold.processors.fold.windows import Window, WindowDelta, WindowFold
from refold.processors.runtime.window_writes import write_windows
from refold.processors.sales_windows.config import SALES_WINDOWS
from refold.processors.sales_windows.projection import SalesWindows
from refold.processors.unique_visitors.projection import ALL, HOUR_MS, UniqueVisitors
from refold.replay.generations_admin import diff_generations
from refold.services.api.app import create_app
from refold.services.api.config import HttpSettings, ServeSettings
from refold.services.api.context import ServiceContext
from refold.services.errors import NoLiveGenerationError, UnknownWindowError, WindowQueryError
from refold.services.reader.window_reader import WindowReader

T0 = 1_699_999_200_000  # an hour boundary (epoch ms)
MINUTE = 60_000
CURRENCIES = ("EUR", "USD:b2b", "a:b:c")  # groups are user data: ':' included
METHODS = ("card", "paypal", "bank_transfer", "klarna")
DEVICES = ("mobile", "desktop", "tablet")
SALES_TIME = EventTime(field="paid_at", lateness_ms=30_000)
VISITS_TIME = EventTime(field="occurred_at", lateness_ms=60_000, late="accept")

Record = tuple[str, int, str, Mapping[str, Any]]


@dataclass
class World:
    client: redis.Redis
    prefix: str
    registry: GenerationRegistry

    def write(
        self, generation: int, fold: WindowFold, event_time: EventTime, records: Sequence[Record]
    ) -> None:
        """Add the records to the fold's generation's buckets: one transaction per partition."""
        keys = StateLayout(fold.name, self.prefix).generation(generation)
        for partition in sorted({r[0] for r in records}):
            delta = WindowDelta()
            for _p, _offset, event_type, event in (r for r in records if r[0] == partition):
                at = event_time_ms(event, event_time.field)
                for measure in fold.measure(event_type, event):
                    delta.add(fold.windows, at, measure, event_time.retention_ms)
            _commit(self.client, keys, delta)


def _commit(client: redis.Redis, keys: GenerationKeys, delta: WindowDelta) -> None:
    with client.pipeline(transaction=True) as pipe:
        write_windows(pipe, keys, delta)
        pipe.execute()


@pytest.fixture
def world(redis_url, unique) -> World:
    client = redis_client(redis_url)
    prefix = f"test-{unique}"
    return World(client, prefix, GenerationRegistry.of(client, "sales_windows", prefix))


def sales(n: int = 300, seed: int = 7, minutes: int = 20) -> list[Record]:
    """Payments over ``minutes``, on two partitions, each in event-time order (none late)."""
    rng = random.Random(seed)
    events: list[dict[str, Any]] = [
        {
            "paid_at": T0 + rng.randrange(minutes * MINUTE),
            "currency": rng.choice(CURRENCIES),
            "amount_minor": rng.randrange(100, 50_000),
            "payment_method": rng.choice(METHODS),
        }
        for _ in range(n)
    ]
    records: list[Record] = []
    for partition in (0, 1):
        mine = sorted(events[partition::2], key=lambda e: e["paid_at"])
        records += [(f"orders/{partition}", i, "OrderPaid", e) for i, e in enumerate(mine)]
    return records


def page_views(n: int = 1500, seed: int = 11, visitors: int = 400) -> list[Record]:
    """A day of page views by ``visitors`` visitors, on one partition, in event-time order."""
    rng = random.Random(seed)
    times = sorted(T0 + rng.randrange(24 * HOUR_MS) for _ in range(n))
    return [
        (
            "web.pageviews/0",
            i,
            "PageViewed",
            {
                "occurred_at": at,
                "visitor_id": f"v-{rng.randrange(visitors)}",
                "device": rng.choice(DEVICES),
            },
        )
        for i, at in enumerate(times)
    ]


def assert_same_result(read: Mapping[str, Any], expected: Mapping[str, Any]) -> None:
    """Equal, but distinct counts (HyperLogLog estimates) within the sketch's error."""
    assert read.keys() == expected.keys()
    for name, value in expected.items():
        if name.startswith("distinct:"):
            assert read[name] == pytest.approx(value, rel=0.03, abs=1), name
        else:
            assert read[name] == value, name


def ends(window: Window, oracle: WindowOracle) -> list[int]:
    """Every end of a window of ``window`` that the oracle has a bucket for."""
    return sorted(
        {
            e
            for (name, start, _g) in oracle.buckets
            if name == window.name
            for e in window.ends(start)
        }
    )


def window_named(fold: WindowFold, name: str) -> Window:
    return next(w for w in fold.windows if w.name == name)


@pytest.mark.parametrize("name", ["per_minute", "five_minutes_hopping", "five_minutes_sliding"])
def test_every_window_reads_as_the_oracle_computes_it(world, name):
    fold = SalesWindows()
    records = sales()
    oracle = fold_windows(fold, SALES_TIME, records)
    assert not oracle.late
    gen = world.registry.create({}, live=True)
    world.write(gen, fold, SALES_TIME, records)
    reader = WindowReader.from_fold(world.client, fold, world.prefix)
    window = window_named(fold, name)
    window_ends = ends(window, oracle)
    assert window_ends
    for group in CURRENCIES:
        for end in window_ends:
            view = reader.window(name, group, end)
            assert view.generation == gen
            assert_same_result(view.value, oracle.window(window, end, group))
        # One past the data: no buckets, count 0 and nothing else.
        after = reader.window(name, group, window_ends[-1] + window.size_ms).value
        assert after["count"] == 0
        assert "sum:amount_minor" not in after


@pytest.mark.parametrize("name", ["per_minute", "five_minutes_hopping", "five_minutes_sliding"])
def test_a_range_lists_every_window_with_data(world, name):
    fold = SalesWindows()
    records = sales()
    oracle = fold_windows(fold, SALES_TIME, records)
    gen = world.registry.create({}, live=True)
    world.write(gen, fold, SALES_TIME, records)
    reader = WindowReader.from_fold(world.client, fold, world.prefix)
    window = window_named(fold, name)
    start, end = T0 - 10 * MINUTE, T0 + 40 * MINUTE
    for group in CURRENCIES:
        expected = [
            oracle.window(window, e, group)
            for e in ends(window, oracle)
            if start < e <= end and oracle.window(window, e, group)["count"] > 0
        ]
        view = reader.range(name, group, start, end)
        assert view.generation == gen
        assert [r["end"] for r in view.value] == [r["end"] for r in expected]
        for read, wanted in zip(view.value, expected, strict=True):
            assert_same_result(read, wanted)
    # (start, end]: a window ending at ``start`` is left out, one ending at ``end`` is in.
    first_end = ends(window, oracle)[0]
    inside = reader.range(name, "EUR", first_end, first_end + 3 * MINUTE).value
    assert all(first_end < r["end"] <= first_end + 3 * MINUTE for r in inside)
    assert reader.range(name, "EUR", T0 + 60 * MINUTE, T0 + 70 * MINUTE).value == []


def test_distinct_over_a_range_is_the_union_of_the_hourly_sketches(world):
    fold = UniqueVisitors()
    records = page_views()
    oracle = fold_windows(fold, VISITS_TIME, records)
    registry = GenerationRegistry.of(world.client, fold.name, world.prefix)
    gen = registry.create({}, live=True)
    world.write(gen, fold, VISITS_TIME, records)
    reader = WindowReader.from_fold(world.client, fold, world.prefix)

    def exact(group: str, start: int, end: int) -> int:
        seen = [
            values
            for (_w, _m, s, g), values in oracle.distinct.items()
            if g == group and start <= s < end
        ]
        return len(set().union(*seen))

    day = reader.distinct("hourly", "visitors", ALL, T0, T0 + 24 * HOUR_MS)
    assert day.generation == gen
    assert exact(ALL, T0, T0 + 24 * HOUR_MS) > 300  # a union, far more than any hour's
    assert day.value == pytest.approx(exact(ALL, T0, T0 + 24 * HOUR_MS), rel=0.03)
    for group in (ALL, *DEVICES):
        for start, end in ((T0, T0 + 3 * HOUR_MS), (T0 + 5 * HOUR_MS, T0 + 17 * HOUR_MS)):
            got = reader.distinct("hourly", "visitors", group, start, end).value
            assert got == pytest.approx(exact(group, start, end), rel=0.03, abs=1)
    # [start, end): an unaligned start begins at the next hour; an empty span counts nothing.
    unaligned = reader.distinct("hourly", "visitors", ALL, T0 + 1, T0 + 3 * HOUR_MS).value
    assert unaligned == pytest.approx(exact(ALL, T0 + HOUR_MS, T0 + 3 * HOUR_MS), rel=0.03, abs=1)
    assert reader.distinct("hourly", "visitors", ALL, T0 + 1, T0 + 2).value == 0
    assert reader.distinct("hourly", "visitors", ALL, T0 - 5 * HOUR_MS, T0).value == 0
    # Each hour as the closer emits it, per device.
    hourly = window_named(fold, "hourly")
    for group in DEVICES:
        for end in range(T0 + HOUR_MS, T0 + 25 * HOUR_MS, HOUR_MS):
            assert_same_result(
                reader.window("hourly", group, end).value, oracle.window(hourly, end, group)
            )
    assert reader.groups("hourly").value == sorted((ALL, *DEVICES))


def test_groups_are_parsed_from_keys_even_with_colons(world):
    fold = SalesWindows()
    records = sales(n=60)
    gen = world.registry.create({}, live=True)
    world.write(gen, fold, SALES_TIME, records)
    reader = WindowReader.from_fold(world.client, fold, world.prefix)
    for window in fold.windows:
        view = reader.groups(window.name)
        assert view.generation == gen
        assert view.value == sorted(CURRENCIES)
    # A window with data and another processor's keys under the same prefix do not mix.
    other = GenerationRegistry.of(world.client, "other", world.prefix)
    keys = other.keys(other.create({}, live=True))
    world.client.hset(keys.window_bucket("per_minute", T0, "XYZ"), "count", 1)
    assert reader.groups("per_minute").value == sorted(CURRENCIES)


def test_a_read_after_the_flip_reads_the_new_generation(world):
    fold = SalesWindows()
    records = sales()
    old = world.registry.create({}, live=True)
    world.write(old, fold, SALES_TIME, records)
    new = world.registry.create({})
    world.write(new, fold, SALES_TIME, records[: len(records) // 3])
    reader = WindowReader.from_fold(world.client, fold, world.prefix)
    window = window_named(fold, "per_minute")
    end = T0 + 10 * MINUTE
    old_oracle = fold_windows(fold, SALES_TIME, records)
    new_oracle = fold_windows(fold, SALES_TIME, records[: len(records) // 3])

    before = reader.window("per_minute", "EUR", end)
    assert before.generation == old
    assert_same_result(before.value, old_oracle.window(window, end, "EUR"))
    total_before = sum(
        r["count"] for r in reader.range("per_minute", "EUR", T0, T0 + 30 * MINUTE).value
    )

    world.registry.flip(new)
    after = reader.window("per_minute", "EUR", end)
    assert after.generation == new
    assert_same_result(after.value, new_oracle.window(window, end, "EUR"))
    ranged = reader.range("per_minute", "EUR", T0, T0 + 30 * MINUTE)
    assert ranged.generation == new
    assert sum(r["count"] for r in ranged.value) < total_before
    assert reader.groups("per_minute").generation == new
    # An explicit generation still reads the old one.
    assert reader.window("per_minute", "EUR", end, generation=old).value == before.value


def test_watermark_is_the_clocks_minimum_minus_the_lateness(world):
    fold = SalesWindows()
    records = sales()
    oracle = fold_windows(fold, SALES_TIME, records)
    reader = WindowReader.from_fold(world.client, fold, world.prefix, lateness_ms=30_000)
    with pytest.raises(NoLiveGenerationError):
        reader.watermark()
    gen = world.registry.create({}, live=True)
    empty = reader.watermark()
    assert empty.value.watermark is None
    assert empty.value.clocks == {}
    world.client.hset(world.registry.keys(gen).clocks, mapping=oracle.clocks)
    world.client.hset(world.registry.keys(gen).positions, mapping={"orders/0": 150})
    view = reader.watermark()
    assert view.generation == gen
    assert view.value.clocks == oracle.clocks
    assert view.value.watermark == min(oracle.clocks.values()) - 30_000
    assert view.value.lateness_ms == 30_000
    assert view.positions == {("orders", 0): 150}


def test_bad_requests_are_refused_with_clear_errors(world):
    fold = SalesWindows()
    world.registry.create({}, live=True)
    reader = WindowReader.from_fold(world.client, fold, world.prefix)
    for read in (
        lambda: reader.window("per_hour", "EUR", T0),
        lambda: reader.range("per_hour", "EUR", T0, T0 + MINUTE),
        lambda: reader.distinct("per_hour", "payment_methods", "EUR", T0, T0 + MINUTE),
        lambda: reader.groups("per_hour"),
    ):
        with pytest.raises(UnknownWindowError) as info:
            read()
        assert "per_hour" in str(info.value)
        assert "per_minute" in str(info.value)  # names the windows it has
    with pytest.raises(WindowQueryError, match="ending at"):
        reader.window("per_minute", "EUR", T0 + 1)
    with pytest.raises(WindowQueryError, match="distinct measure 'visitors'"):
        reader.distinct("per_minute", "visitors", "EUR", T0, T0 + MINUTE)
    # Sliding windows read every fine bucket of every window: the budget counts them all.
    small = WindowReader.from_fold(world.client, fold, world.prefix, max_buckets=300)
    assert small.range("five_minutes_sliding", "EUR", T0, T0 + 100_000).value == []
    with pytest.raises(WindowQueryError, match="narrower range"):
        small.range("five_minutes_sliding", "EUR", T0, T0 + 110_000)
    with pytest.raises(WindowQueryError, match="narrower range"):
        small.distinct("five_minutes_sliding", "payment_methods", "EUR", T0, T0 + 3_010_000)


def test_diff_compares_window_buckets_and_sketches(world):
    fold = SalesWindows()
    records = sales()
    a = world.registry.create({}, live=True)
    b = world.registry.create({})
    world.write(a, fold, SALES_TIME, records)
    world.write(b, fold, SALES_TIME, list(reversed(records)))  # other order, same buckets
    same = diff_generations(SALES_WINDOWS, world.client, world.prefix, a, b)
    assert same.identical, same.render()
    assert same.buckets_compared > 0
    assert same.sketches_compared > 0
    assert "identical" in same.render()

    keys_a, keys_b = world.registry.keys(a), world.registry.keys(b)
    changed = keys_b.window_bucket("per_minute", T0 + 5 * MINUTE, "USD:b2b")
    world.client.hincrby(changed, "count", 1)
    world.client.delete(keys_a.window_bucket("five_minutes_hopping", T0, "a:b:c"))
    sketch = keys_b.window_distinct("per_minute", "payment_methods", T0, "EUR")
    world.client.pfadd(sketch, "cash-on-delivery")
    diff = diff_generations(SALES_WINDOWS, world.client, world.prefix, a, b)
    assert not diff.identical
    assert set(diff.buckets_differing) == {
        f"w:per_minute:{T0 + 5 * MINUTE}:USD:b2b",
        f"w:five_minutes_hopping:{T0}:a:b:c",
    }
    in_a, in_b = diff.buckets_differing[f"w:per_minute:{T0 + 5 * MINUTE}:USD:b2b"]
    assert in_b["count"] == in_a["count"] + 1
    missing_a, present_b = diff.buckets_differing[f"w:five_minutes_hopping:{T0}:a:b:c"]
    assert missing_a == {}
    assert present_b["count"] > 0
    assert set(diff.sketches_differing) == {f"wd:per_minute:payment_methods:{T0}:EUR"}
    count_a, count_b = diff.sketches_differing[f"wd:per_minute:payment_methods:{T0}:EUR"]
    assert count_b == count_a + 1
    text = diff.render()
    assert f"bucket w:per_minute:{T0 + 5 * MINUTE}:USD:b2b" in text
    assert f"sketch wd:per_minute:payment_methods:{T0}:EUR" in text
    assert "2 differing" in text
    assert "NOT identical" in text


def test_the_query_api_reads_windows_from_the_generations_meta_as_the_reader_does(world):
    """HTTP window routes == WindowReader, the windows rebuilt from the generation's meta."""
    sales_fold, visits_fold = SalesWindows(), UniqueVisitors()
    for fold, event_time, records in (
        (sales_fold, SALES_TIME, sales()),
        (visits_fold, VISITS_TIME, page_views()),
    ):
        registry = GenerationRegistry.of(world.client, fold.name, world.prefix)
        gen = registry.create(window_meta(fold.windows, fold.distinct), live=True)
        world.write(gen, fold, event_time, records)
    settings = ServeSettings(
        redis=RedisSettings(key_prefix=world.prefix),
        serve=HttpSettings(auth="off"),
    )
    context = ServiceContext(settings, world.client)
    sales_reader = WindowReader.from_fold(world.client, sales_fold, world.prefix)
    visits_reader = WindowReader.from_fold(world.client, visits_fold, world.prefix)
    with TestClient(create_app(settings, context=context)) as http:
        base = "/v1/processors/sales_windows/windows"
        groups = http.get(f"{base}/per_minute/groups").json()["groups"]
        assert groups == sales_reader.groups("per_minute").value == sorted(CURRENCIES)
        for name in ("per_minute", "five_minutes_hopping", "five_minutes_sliding"):
            for group in CURRENCIES:
                answer = http.get(
                    f"{base}/{name}/groups/{group}",
                    params={"start": T0, "end": T0 + 30 * MINUTE},
                )
                assert answer.status_code == 200, answer.text
                expected = sales_reader.range(name, group, T0, T0 + 30 * MINUTE).value
                assert answer.json()["results"] == expected
                assert expected
        unknown = http.get(f"{base}/nope/groups/EUR", params={"start": T0, "end": T0 + 1})
        assert unknown.status_code == 404
        assert unknown.json()["error"]["code"] == "WINDOW_UNKNOWN"
        day = http.get(
            "/v1/processors/unique_visitors/windows/hourly/distinct/visitors",
            params={"group": ALL, "start": T0, "end": T0 + 24 * HOUR_MS},
        )
        assert day.status_code == 200, day.text
        expected_day = visits_reader.distinct("hourly", "visitors", ALL, T0, T0 + 24 * HOUR_MS)
        assert day.json()["distinct"] == expected_day.value > 300
        mark = http.get("/v1/processors/sales_windows/watermark").json()
        assert mark["clocks"] == sales_reader.watermark().value.clocks
    context.close()
