"""The results of due windows, from their stored buckets: sliding windows moved bucket by bucket.

:class:`~refold.processors.runtime.window_store.WindowCloser` reads the buckets of the windows
its watermark has passed and makes their results here: a sliding window that follows the one
before it by one fine bucket adds the newest bucket's counts and sums and drops the oldest's
(:func:`_slide`), its extremes kept in monotonic deques (:class:`_Extremes`).

Lifecycle: pure functions of the buckets as read; the closer calls them on the driver.
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Mapping, Sequence
from typing import Any

from refold.processors.fold.windows import Window, combine, result_of

__all__ = ["window_results"]


def window_results(
    by_name: Mapping[str, Window],
    scales: Mapping[str, int],
    windows: Sequence[tuple[str, int, str]],
    stored: Mapping[tuple[str, int, str], Mapping[str, int]],
    distinct: Mapping[tuple[str, int, str], Mapping[str, int]],
) -> list[dict[str, Any]]:
    """The results of the due windows, sliding ones moved incrementally bucket by bucket.

    Args:
        by_name: The processor's windows by name (a due window of another name is skipped).
        scales: The measures' decimal scales (``scales_of``).
        windows: The due windows: name, end, group.
        stored: Every bucket of them, merged over the shards.
        distinct: Per due window, its distinct counts.
    """
    extremes = {
        b: {k: v for k, v in fields.items() if k.startswith(("min:", "max:"))}
        for b, fields in stored.items()
    }
    by_series: dict[tuple[str, str], list[int]] = defaultdict(list)
    for name, end, group in windows:
        if name in by_name:
            by_series[(name, group)].append(end)
    results = []
    for (name, group), ends in sorted(by_series.items()):
        window = by_name[name]
        running: dict[str, int] | None = None
        previous: int | None = None
        lows_highs = _Extremes()
        for end in sorted(ends):
            starts = window.bucket_starts(end)
            if running is not None and previous == end - window.bucket_ms and len(starts) > 1:
                running = _slide(running, stored, name, group, window, end)
                lows_highs.push(
                    end - window.bucket_ms, extremes[(name, end - window.bucket_ms, group)]
                )
                lows_highs.expire(starts[0])
            else:
                parts = combine(stored[(name, s, group)] for s in starts)
                running = {k: v for k, v in parts.items() if not k.startswith(("min:", "max:"))}
                lows_highs = _Extremes()
                for start in starts:
                    lows_highs.push(start, extremes[(name, start, group)])
            aggregates = {**running, **lows_highs.value()}
            counts = distinct.get((name, end, group), {})
            results.append(result_of(window, end, group, aggregates, counts, scales))
            previous = end
    return results


class _Extremes:
    """Minimum and maximum over a run of fine buckets sliding by one: monotonic deques.

    Each bucket enters and leaves each deque once, so moving a sliding window costs O(1) per
    extreme instead of combining all of its fine buckets again.
    """

    def __init__(self) -> None:
        self._deques: dict[str, deque[tuple[int, int]]] = {}

    def push(self, start: int, fields: Mapping[str, int]) -> None:
        """The bucket starting at ``start`` enters the window (buckets in start order)."""
        for name, value in fields.items():
            queue = self._deques.setdefault(name, deque())
            lowest = name.startswith("min:")
            while queue and (queue[-1][1] >= value if lowest else queue[-1][1] <= value):
                queue.pop()
            queue.append((start, value))

    def expire(self, oldest: int) -> None:
        """Buckets starting before ``oldest`` have left the window."""
        for queue in self._deques.values():
            while queue and queue[0][0] < oldest:
                queue.popleft()

    def value(self) -> dict[str, int]:
        """The extremes of the buckets in the window."""
        return {name: queue[0][1] for name, queue in self._deques.items() if queue}


def _slide(
    running: Mapping[str, int],
    stored: Mapping[tuple[str, int, str], Mapping[str, int]],
    name: str,
    group: str,
    window: Window,
    end: int,
) -> dict[str, int]:
    """The next sliding window's counts and sums: add the newest fine bucket, drop the oldest."""
    step = window.bucket_ms
    entering = stored[(name, end - step, group)]
    leaving = stored.get((name, end - step - window.size_ms, group), {})
    out = {k: v for k, v in running.items() if not k.startswith(("min:", "max:"))}
    for k, v in entering.items():
        if not k.startswith(("min:", "max:")):
            out[k] = out.get(k, 0) + v
    for k, v in leaving.items():
        if not k.startswith(("min:", "max:")):
            out[k] = out.get(k, 0) - v
    # A value none of whose events is left in the window is no key (as in ``combine``).
    present = {k for s in window.bucket_starts(end) for k in stored.get((name, s, group), {})}
    return {k: v for k, v in out.items() if k in present}
