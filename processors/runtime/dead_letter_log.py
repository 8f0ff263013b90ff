"""The one log line of a chunk's dead letters (pure: the envelope logs what this returns)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from refold.processors.fold.records import SourceRecord

__all__ = ["DeadLetterLike", "summarise_letters"]


class DeadLetterLike(Protocol):
    """What a summary reads of a dead letter (the envelope's ``_DeadLetter``)."""

    @property
    def record(self) -> SourceRecord:
        """The record that was not applied."""
        ...

    @property
    def reason(self) -> str:
        """Its ``refold.reason``."""
        ...

    @property
    def detail(self) -> str:
        """Its error."""
        ...


def summarise_letters(letters: Sequence[DeadLetterLike], topic: str) -> str:
    """One line for a chunk's dead letters: the count per reason with its first origin.

    A batch of bad input used to log one line per record (677 of a processor's first 807 log
    lines, without processor or origin); each record's detail stays at DEBUG and in the dead
    letter's headers.
    """
    by_reason: dict[str, list[DeadLetterLike]] = {}
    for letter in letters:
        by_reason.setdefault(letter.reason, []).append(letter)
    parts = []
    for reason, group in sorted(by_reason.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        first = group[0].record
        parts.append(
            f"{reason} x{len(group)} (first {first.topic}/{first.partition}@{first.offset}: "
            f"{group[0].detail[:200]})"
        )
    return f"{len(letters)} record(s) to {topic}: " + "; ".join(parts)
