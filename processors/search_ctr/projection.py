"""The search_ctr fold: searches joined with their clicks within a window, per session.

Pure (see :mod:`refold.processors.fold.timers`). The session's state is the join buffer:

- ``searches``: search id -> ``[term, time, clicked]``, unsettled searches;
- ``clicks``: search id -> click times of clicks whose search has not come (yet);
- ``settled``: term -> ``[searches, clicked]``, what the buffer has let go of.

A search is clicked when a click on it falls in ``[search time, search time + window]``,
whichever arrives first. Its timer is due one millisecond after its window: from then on an
on-time click has a later event time, so the search is settled. An orphan click is settled
(dropped) one millisecond after its own time: a search comes before its clicks, and an on-time
search would now be later. So buffers never outlive the watermark, and the outcome depends only
on which events are on time, never on their order.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from refold.contracts.processors import ProcessorOptions
from refold.processors.fold.eventtime import event_time_ms
from refold.processors.fold.projection import EventRejectedError, State

__all__ = ["WINDOW_MS", "SearchCtrProjection", "build", "ctr"]

WINDOW_MS = 10 * 60_000


def ctr(totals: Mapping[str, int]) -> dict[str, tuple[int, int, float]]:
    """Per term, from the ``ctr`` aggregate: (searches, clicked, click-through rate)."""
    out = {}
    for name, searches in totals.items():
        if name.startswith("searches:") and searches:
            term = name[len("searches:") :]
            clicked = totals.get(f"clicked:{term}", 0)
            out[term] = (searches, clicked, clicked / searches)
    return out


class SearchCtrProjection:
    """The join buffer of each session (table ``search_buffers``) and the CTR per term."""

    name = "search_ctr"
    table = "search_buffers"
    aggregate = "ctr"
    event_types = ("SearchPerformed", "SearchResultClicked")

    def __init__(self, window_ms: int = WINDOW_MS) -> None:
        self.window_ms = window_ms

    def key(self, event_type: str, event: Mapping[str, Any]) -> str:
        """The buffer is per session."""
        del event_type
        return str(event["session_id"])

    def apply(self, state: State | None, event_type: str, event: Mapping[str, Any]) -> State:
        """Buffer the search or the click, matching it with the other side if it is there."""
        current = state or {"searches": {}, "clicks": {}, "settled": {}}
        search_id, at = str(event["search_id"]), event_time_ms(event, "occurred_at")
        searches, clicks = dict(current["searches"]), dict(current["clicks"])
        if event_type == "SearchPerformed":
            if search_id in searches:
                msg = f"search {search_id} was performed already"
                raise EventRejectedError(msg)
            waiting = clicks.pop(search_id, [])
            clicked = any(at <= t <= at + self.window_ms for t in waiting)
            searches[search_id] = [str(event["query"]), at, clicked]
        elif search_id in searches:
            term, when, clicked = searches[search_id]
            searches[search_id] = [term, when, clicked or when <= at <= when + self.window_ms]
        else:
            clicks[search_id] = sorted([*clicks.get(search_id, []), at])
        return {**current, "searches": searches, "clicks": clicks}

    def due(self, state: State) -> int | None:
        """The earliest end of a search's window (+1 ms) or orphan click's time (+1 ms)."""
        ends = [when + self.window_ms + 1 for _t, when, _c in state["searches"].values()]
        ends += [times[-1] + 1 for times in state["clicks"].values()]
        return min(ends, default=None)

    def on_timer(self, state: State, watermark: int) -> State | None:
        """Settle the searches and drop the orphan clicks the watermark has passed."""
        settled = {k: list(v) for k, v in state["settled"].items()}
        searches = {}
        for search_id, (term, when, clicked) in state["searches"].items():
            if when + self.window_ms + 1 <= watermark:
                counts = settled.setdefault(term, [0, 0])
                counts[0] += 1
                counts[1] += int(clicked)
            else:
                searches[search_id] = [term, when, clicked]
        clicks = {s: t for s, t in state["clicks"].items() if t[-1] + 1 > watermark}
        return {"searches": searches, "clicks": clicks, "settled": settled}

    def contribution(self, state: State) -> Mapping[str, int]:
        """Settled searches and clicked ones, per term."""
        out: dict[str, int] = {}
        for term, (searches, clicked) in state["settled"].items():
            out[f"searches:{term}"] = searches
            out[f"clicked:{term}"] = clicked
        return out


def build(options: ProcessorOptions) -> SearchCtrProjection:
    """The projection (the spec's ``projection`` factory); it has no options of its own."""
    del options
    return SearchCtrProjection()
