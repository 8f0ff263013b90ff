"""What a dead-letter topic holds, for the dead-letters-once tests of every engine."""

from __future__ import annotations

from refold.contracts.origin import (
    DEAD_LETTER_REASON,
    ORIGIN_GENERATION,
    ORIGIN_OFFSET,
    ORIGIN_PARTITION,
)
from tests.support.topics import read_to_end

__all__ = ["dlq_letters"]


def dlq_letters(bootstrap: str, topic: str) -> list[tuple[int, int, str, int]]:
    """(origin partition, origin offset, reason, generation) of every letter on the topic."""
    found = []
    for message in read_to_end(bootstrap, topic):
        headers = {k: v.decode() for k, v in message.headers() or []}
        found.append(
            (
                int(headers[ORIGIN_PARTITION]),
                int(headers[ORIGIN_OFFSET]),
                headers[DEAD_LETTER_REASON],
                int(headers[ORIGIN_GENERATION]),
            )
        )
    return found
