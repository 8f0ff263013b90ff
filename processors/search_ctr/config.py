"""The search_ctr processor as the platform sees it (``refold.processors`` entry point).

A windowed stream-stream join on ``web.searches`` (keyed by ``session_id``): a
``SearchPerformed`` and a ``SearchResultClicked`` on it (same ``search_id``, same session)
within 10 minutes of event time. Both sides wait in the session's join buffer, whichever comes
first; a search is settled (clicked or not) once the watermark is past its window, and an
orphan click once no on-time search can come for it. The aggregate ``ctr`` holds, per search
term, the settled searches and the clicked ones.
"""

from __future__ import annotations

from refold.contracts.processors import EventTime, ProcessorSpec
from refold.contracts.web import SEARCHES

__all__ = ["SEARCH_CTR"]

SEARCH_CTR = ProcessorSpec(
    name="search_ctr",
    projection="refold.processors.search_ctr.projection:build",
    topics=(SEARCHES.name,),
    key="session_id",
    tables=("search_buffers",),
    aggregates=("ctr",),
    event_time=EventTime(field="occurred_at", lateness_ms=5 * 60_000),
    description="click-through rate per search term: searches joined with clicks within 10 min",
)
