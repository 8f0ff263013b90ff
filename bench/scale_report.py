"""The scale curve's arithmetic and table (``python -m bench scale``): pure, unit-tested.

A size's figures are one flat mapping (``bench/results/scale.json``, ``sizes``); the ratios
compare each size with the smallest, so "flat" reads as ratios near 1.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["COLUMNS", "RATIOS", "per_entity", "ratios", "table"]

# The figures compared across sizes: a flat curve keeps each of them near the smallest size's.
RATIOS = (
    "order_state_rate_steady",
    "order_state_rate_wall",
    "order_state_cpu_s_per_million",
    "order_state_peak_rss_mb",
    "order_state_bytes_per_entity",
    "sales_windows_rate_steady",
    "sales_windows_cpu_s_per_million",
    "sales_windows_peak_rss_mb",
    "sales_windows_bytes_per_bucket",
    "kafka_streams_rate_steady",
    "kafka_streams_cpu_s_per_million",
    "kafka_streams_disk_bytes_per_entity",
)

# (label, figure, format) of the table's rows; one column per size.
COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("load average (1 min) before", "load_before", "{:.1f}"),
    ("load average (1 min) after", "load_after", "{:.1f}"),
    ("order states (entities)", "order_state_entities", "{:,.0f}"),
    ("order_state steady ev/s", "order_state_rate_steady", "{:,.0f}"),
    ("order_state incl. start-up ev/s", "order_state_rate_wall", "{:,.0f}"),
    ("order_state CPU-s per 1M events", "order_state_cpu_s_per_million", "{:,.0f}"),
    ("order_state peak RSS MB", "order_state_peak_rss_mb", "{:,.0f}"),
    ("order_state Redis used_memory MB", "order_state_used_memory_mb", "{:,.1f}"),
    ("order_state B/entity (used_memory delta)", "order_state_bytes_per_entity", "{:,.0f}"),
    ("order_state B/entity (MEMORY USAGE)", "order_state_memory_usage_avg", "{:,.0f}"),
    ("order_state = oracle", "order_state_check", "{}"),
    ("window buckets (w:) / sketches (wd:)", "sales_windows_buckets_sketches", "{}"),
    ("sales_windows steady ev/s", "sales_windows_rate_steady", "{:,.0f}"),
    ("sales_windows incl. start-up ev/s", "sales_windows_rate_wall", "{:,.0f}"),
    ("sales_windows CPU-s per 1M events", "sales_windows_cpu_s_per_million", "{:,.0f}"),
    ("sales_windows peak RSS MB", "sales_windows_peak_rss_mb", "{:,.0f}"),
    ("sales_windows Redis used_memory MB", "sales_windows_used_memory_mb", "{:,.1f}"),
    ("sales_windows B/bucket (delta, HLLs incl.)", "sales_windows_bytes_per_bucket", "{:,.0f}"),
    ("sales_windows B/bucket (MEMORY USAGE)", "sales_windows_bucket_usage_avg", "{:,.0f}"),
    ("sales_windows B/HLL (MEMORY USAGE)", "sales_windows_sketch_usage_avg", "{:,.0f}"),
    ("sales_windows = oracle", "sales_windows_check", "{}"),
    ("Kafka Streams steady ev/s", "kafka_streams_rate_steady", "{:,.0f}"),
    ("Kafka Streams incl. start-up ev/s", "kafka_streams_rate_wall", "{:,.0f}"),
    ("Kafka Streams CPU-s per 1M events", "kafka_streams_cpu_s_per_million", "{:,.0f}"),
    ("Kafka Streams peak RSS MB", "kafka_streams_peak_rss_mb", "{:,.0f}"),
    ("Kafka Streams RocksDB on disk MB", "kafka_streams_disk_mb", "{:,.1f}"),
    ("Kafka Streams disk B/entity", "kafka_streams_disk_bytes_per_entity", "{:,.0f}"),
    ("Kafka Streams = oracle", "kafka_streams_check", "{}"),
)


def per_entity(total_bytes: float, entities: int) -> float | None:
    """Bytes per entity (None without entities)."""
    return total_bytes / entities if entities > 0 else None


def ratios(sizes: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, float | None]]:
    """Each figure of :data:`RATIOS` at every size over the smallest size's.

    Args:
        sizes: One mapping per size, with ``events`` and the figures; any order.

    Returns:
        ``{"4M/1M": {figure: ratio}}`` for every size but the smallest (labels in millions,
        or thousands below 1M); a ratio is None where either figure is missing or zero.
    """
    ordered = sorted(sizes, key=lambda s: int(s["events"]))
    if not ordered:
        return {}
    first = ordered[0]
    out: dict[str, dict[str, float | None]] = {}
    for size in ordered[1:]:
        label = f"{_short(int(size['events']))}/{_short(int(first['events']))}"
        out[label] = {
            name: (size[name] / first[name] if size.get(name) and first.get(name) else None)
            for name in RATIOS
        }
    return out


def _short(events: int) -> str:
    if events % 1_000_000 == 0:
        return f"{events // 1_000_000}M"
    if events % 1_000 == 0:
        return f"{events // 1_000}k"
    return f"{events:,}"


def _cell(value: Any, fmt: str) -> str:
    if value is None:
        return "-"
    return fmt.format(value)


def table(sizes: Sequence[Mapping[str, Any]]) -> str:
    """One row per figure of :data:`COLUMNS`, one column per size, then the ratios."""
    ordered = sorted(sizes, key=lambda s: int(s["events"]))
    found = ratios(ordered)
    header = ["events", *(_short(int(s["events"])) for s in ordered), *found]
    rows = [header]
    for label, name, fmt in COLUMNS:
        if all(s.get(name) is None for s in ordered):
            continue
        cells = [_cell(s.get(name), fmt) for s in ordered]
        extra = [_cell(found[r].get(name), "{:.2f}") if name in RATIOS else "" for r in found]
        rows.append([label, *cells, *extra])
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return "\n".join(
        "  ".join(
            cell.ljust(w) if i == 0 else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in rows
    )
