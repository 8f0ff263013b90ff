"""A task's outcome crosses from the Spark worker to the driver whole (one Arrow row each way)."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from refold.processors.runtime.archive.sink import ARCHIVE_OUTCOME_SCHEMA, ArchiveOutcome
from refold.processors.runtime.envelope import BatchOutcome
from refold.processors.runtime.outcome_rows import OutcomeRows
from refold.processors.runtime.sink import OUTCOME_SCHEMA, _outcome_of_row, _outcome_rows


@pytest.mark.parametrize("kind", [BatchOutcome, ArchiveOutcome])
def test_every_field_of_an_outcome_survives_the_row_round_trip(kind: type) -> None:
    outcome = kind(positions={"orders/0": 12}, dead_letters={"rejected": 2})
    for number, spec in enumerate(dataclasses.fields(kind), start=1):
        if spec.type in ("int", int):  # a distinct value per counter: a shifted field shows
            setattr(outcome, spec.name, number)
    rows = OutcomeRows(kind)
    (batch,) = list(rows.rows(outcome))
    (row,) = batch.to_pylist()
    assert rows.of_row(SimpleNamespace(**row)) == outcome
    assert rows.ddl.split(", ")[0] == f"{dataclasses.fields(kind)[0].name} long"


def test_the_sinks_send_their_outcomes_through_the_derived_rows() -> None:
    outcome = BatchOutcome(records=3, positions={"orders/1": 4})
    (batch,) = list(_outcome_rows(outcome))
    assert _outcome_of_row(SimpleNamespace(**batch.to_pylist()[0])) == outcome
    assert not list(_outcome_rows(BatchOutcome()))  # a task that read nothing sends no row
    assert "positions string" in OUTCOME_SCHEMA
    assert "dead_letters string" in ARCHIVE_OUTCOME_SCHEMA


@pytest.mark.parametrize("kind", [BatchOutcome, ArchiveOutcome])
def test_merging_adds_every_counter_takes_later_positions_and_adds_letters(kind: type) -> None:
    counters = [f.name for f in dataclasses.fields(kind) if f.type in ("int", int)]
    first = kind(positions={"o/0": 5, "o/1": 3}, dead_letters={"bad-body": 1})
    second = kind(positions={"o/1": 9}, dead_letters={"bad-body": 2, "rejected": 1})
    for number, name in enumerate(counters, start=1):  # distinct values: a missed field shows
        setattr(first, name, number)
        setattr(second, name, 100 * number)
    first.merge(second)
    assert {n: getattr(first, n) for n in counters} == {
        n: 101 * i for i, n in enumerate(counters, start=1)
    }
    assert first.positions == {"o/0": 5, "o/1": 9}
    assert first.dead_letters == {"bad-body": 3, "rejected": 1}
