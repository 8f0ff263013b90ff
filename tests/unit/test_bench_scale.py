"""bench/scale_report.py: the scale curve's ratios, bytes per entity and table."""

import pytest

from bench.scale_report import RATIOS, per_entity, ratios, table

pytestmark = pytest.mark.unit


def _size(events, rate, rss, per_key):
    return {
        "events": events,
        "load_before": 1.5,
        "order_state_entities": events // 9,
        "order_state_rate_steady": rate,
        "order_state_peak_rss_mb": rss,
        "order_state_bytes_per_entity": per_key,
        "order_state_check": "ok",
    }


def test_ratios_are_each_size_over_the_smallest_whatever_the_order_and_none_where_missing():
    sizes = [
        _size(10_000_000, 30_000.0, 2_400.0, 660.0),
        _size(1_000_000, 40_000.0, 2_000.0, 600.0),
        _size(4_000_000, 36_000.0, 2_200.0, 630.0),
    ]
    got = ratios(sizes)
    assert list(got) == ["4M/1M", "10M/1M"]
    assert got["4M/1M"]["order_state_rate_steady"] == pytest.approx(0.9)
    assert got["10M/1M"]["order_state_rate_steady"] == pytest.approx(0.75)
    assert got["10M/1M"]["order_state_peak_rss_mb"] == pytest.approx(1.2)
    assert got["10M/1M"]["order_state_bytes_per_entity"] == pytest.approx(1.1)
    # A figure no size has (no Kafka Streams run) has no ratio, rather than a division by 0.
    assert got["10M/1M"]["kafka_streams_rate_steady"] is None
    assert set(got["4M/1M"]) == set(RATIOS)
    assert ratios([]) == {}
    assert list(ratios([_size(100_000, 1.0, 1.0, 1.0), _size(250_000, 2.0, 1.0, 1.0)])) == [
        "250k/100k"
    ]


def test_per_entity_divides_and_has_no_figure_without_entities():
    assert per_entity(6_000_000, 10_000) == 600
    assert per_entity(6_000_000, 0) is None


def test_the_table_has_a_column_per_size_then_the_ratios_and_skips_figures_no_size_has():
    text = table(
        [_size(4_000_000, 36_000.0, 2_200.0, 630.0), _size(1_000_000, 40_000.0, 2_000.0, 600.0)]
    )
    lines = text.splitlines()
    assert lines[0].split() == ["events", "1M", "4M", "4M/1M"]
    steady = next(line for line in lines if line.startswith("order_state steady ev/s"))
    assert steady.split()[-3:] == ["40,000", "36,000", "0.90"]
    check = next(line for line in lines if line.startswith("order_state = oracle"))
    assert check.split()[-2:] == ["ok", "ok"]  # no ratio for a check
    assert not any(line.startswith("Kafka Streams") for line in lines)


def test_a_bucket_is_expirable_once_the_watermark_reached_its_last_end_plus_the_retention():
    from bench.scale import _expirable
    from refold.processors.fold.oracle import WindowOracle

    day = 24 * 3_600_000  # sales_windows' retention
    counts = {"count": 1}
    oracle = WindowOracle(
        buckets={
            ("per_minute", 0, "EUR"): counts,  # last end 60 s
            ("five_minutes_hopping", 0, "EUR"): counts,  # last end 5 min
            ("five_minutes_sliding", 0, "USD"): counts,  # 10 s steps, last end 5 min
            ("per_minute", 60_000, "EUR"): counts,  # last end 2 min
        }
    )
    assert _expirable(oracle, 60_000 + day) == {("per_minute", 0, "EUR")}
    assert _expirable(oracle, 60_000 + day - 1) == set()
    assert _expirable(oracle, 300_000 + day) == set(oracle.buckets)
