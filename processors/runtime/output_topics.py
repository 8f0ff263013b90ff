"""The topics a processor writes besides its state, named in one place.

A processor creates them when it starts a generation; ``refold topics`` creates them before
any processor runs, so a consumer started first (``refold webhooks run`` on a pattern
processor's insights, ``refold tail``) finds its topic. Both call :func:`output_topics` and
:func:`output_topic_specs`, so the two lists cannot drift apart. Pure: no network.
"""

from __future__ import annotations

from collections.abc import Mapping

from refold.contracts.processors import EventTime
from refold.contracts.topics import TopicSpec, effects_spec
from refold.processors.fold.projection import Projection
from refold.processors.runtime.engines import engine_of

__all__ = ["late_topic", "output_topic_specs", "output_topics"]


def late_topic(processor: str, event_time: EventTime | None) -> str:
    """Where late records go under ``side-output``: ``late_topic``, else ``<processor>.late``."""
    custom = event_time.late_topic if event_time else ""
    return custom or f"{processor}.late"


def output_topics(
    projection: Projection, event_time: EventTime | None, windows_option: str | None
) -> list[str]:
    """The output topics of one processor, dead letters aside.

    Args:
        projection: The processor's fold, as its spec's factory builds it.
        event_time: The spec's event time (its late policy names a side-output topic).
        windows_option: The processor's ``windows_topic`` option (None: ``<processor>.windows``).

    Returns:
        Its side effects' topics (``effect_topics``: a pattern processor's insights, an output
        stream), its engine's result topics (a window fold's closed windows), and its late
        records' topic (the ``side-output`` policy), in that order.
    """
    name = projection.name
    outputs = list(getattr(projection, "effect_topics", ()) or ())
    outputs.extend(engine_of(projection).result_topics(projection, windows_option))
    if event_time is not None and event_time.late == "side-output":
        outputs.append(late_topic(name, event_time))
    return outputs


def output_topic_specs(names: list[str], declared: Mapping[str, TopicSpec]) -> list[TopicSpec]:
    """The specs to create ``names`` with.

    An output stream with a contract is declared by a contract set (its partitions and key,
    in ``declared``); any other output topic gets the side-effect defaults.
    """
    return [declared.get(name) or effects_spec(name) for name in names]
