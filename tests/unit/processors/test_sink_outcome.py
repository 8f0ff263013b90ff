"""A task's outcome crosses from the Spark worker to the driver whole (one Arrow row each way)."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from refold.processors.runtime.archive_sink import ARCHIVE_OUTCOME_SCHEMA, ArchiveOutcome
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
