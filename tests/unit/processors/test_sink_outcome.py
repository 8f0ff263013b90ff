"""A task's outcome crosses from the Spark worker to the driver whole (one Arrow row each way)."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

from refold.processors.runtime.envelope import BatchOutcome
from refold.processors.runtime.sink import _outcome_of_row, _outcome_rows


def test_every_field_of_an_outcome_survives_the_row_round_trip() -> None:
    outcome = BatchOutcome(positions={"orders/0": 12}, dead_letters={"rejected": 2})
    for number, spec in enumerate(dataclasses.fields(BatchOutcome), start=1):
        if spec.type in ("int", int):  # a distinct value per counter: a shifted field shows
            setattr(outcome, spec.name, number)
    (batch,) = list(_outcome_rows(outcome))
    (row,) = batch.to_pylist()
    assert _outcome_of_row(SimpleNamespace(**row)) == outcome
