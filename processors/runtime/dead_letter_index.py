"""Dead letters once: what a generation decided, and what a rebuild must not send again.

Every generation records the letters it decided, dead letters and late records alike, in its
``dl:letters`` hash (:attr:`~refold.contracts.layout.GenerationKeys.dead_letters`): the field
is the record's origin and the letter's rank among that record's letters
(``<topic>/<partition>@<offset>.<n>``: a record refused by the fold has one letter, a record
that also fired failing timers has more), the value its reason. The hash is written in the
transaction that moves the positions, so it holds the letters of exactly the applied records.

A generation being rebuilt (``building``) reads the live generation's hash for the records
the live generation has already applied: a letter with the same origin and reason was sent
then, and is not sent again. A letter with another reason (the new code refuses the record
for a new reason, or refuses a record the old code applied) is sent, and its headers name the
building generation. Records past the live generation's positions are sent as usual, so the
cutover loses none. A live generation written before this index existed has no entries: a
rebuild then sends its letters, as it always did.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from refold.contracts.layout import parse_position_field, position_field
from refold.processors.runtime.dead_letters import DeadLetter

__all__ = ["ReasonSummary", "index_fields", "letters_to_send", "summarise_index"]


def index_fields(letters: Sequence[DeadLetter]) -> list[str]:
    """Each letter's field in the index: its record's origin and its rank among that record's."""
    seen: dict[tuple[str, int, int], int] = {}
    fields = []
    for letter in letters:
        origin = letter.record[:3]
        rank = seen.get(origin, 0)
        seen[origin] = rank + 1
        fields.append(f"{position_field(origin[0], origin[1])}@{origin[2]}.{rank}")
    return fields


def letters_to_send(
    letters: Sequence[DeadLetter],
    fields: Sequence[str],
    live_positions: Mapping[str, int],
    live_reasons: Iterable[str | None],
) -> list[int]:
    """The indices of the letters a building generation sends (pure).

    Args:
        letters: The batch's letters, in order.
        fields: Their :func:`index_fields`.
        live_positions: The live generation's applied positions (``<topic>/<partition>`` ->
            next offset) of the letters' partitions.
        live_reasons: The live generation's reason for each field (``None``: it has none).
    """
    send = []
    for index, (letter, _field, live_reason) in enumerate(
        zip(letters, fields, live_reasons, strict=True)
    ):
        topic, partition, offset = letter.record[:3]
        applied_by_live = offset < live_positions.get(position_field(topic, partition), 0)
        if not applied_by_live or live_reason != letter.reason:
            send.append(index)
    return send


@dataclass(frozen=True, slots=True)
class ReasonSummary:
    """The letters of one reason in a generation's index (``refold dlq list``)."""

    reason: str
    count: int
    first: tuple[str, ...]  # the first origins, ``<topic>/<partition>@<offset>``, in log order


def _origin_order(field: str) -> tuple[str, int, int, int]:
    origin, _, rank = field.rpartition(".")
    where, _, offset = origin.rpartition("@")
    topic, partition = parse_position_field(where) or (where, 0)
    return topic, partition, int(offset), int(rank)


def summarise_index(entries: Mapping[str, str], examples: int = 3) -> list[ReasonSummary]:
    """A generation's dead-letter index by reason, the commonest first (pure).

    Args:
        entries: The index: ``<topic>/<partition>@<offset>.<n>`` -> reason.
        examples: How many origins to name per reason, the first in log order.
    """
    by_reason: dict[str, list[str]] = {}
    for field, reason in entries.items():
        by_reason.setdefault(reason, []).append(field)
    summaries = []
    for reason, fields in by_reason.items():
        fields.sort(key=_origin_order)
        first = tuple(dict.fromkeys(f.rpartition(".")[0] for f in fields))[:examples]
        summaries.append(ReasonSummary(reason, len(fields), first))
    return sorted(summaries, key=lambda s: (-s.count, s.reason))
