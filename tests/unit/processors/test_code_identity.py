"""Which code may write a generation: a Spark worker that loaded an edited file refuses."""

from __future__ import annotations

import importlib

import pytest

from refold.processors.errors import CodeChangedError
from refold.processors.runtime import code_identity
from refold.processors.runtime.code_identity import (
    build_fingerprints,
    changed_fingerprints,
    check_executor_code,
)

FOLD = """
class Counting:
    name = "counting"
    table = "things"
    aggregate = "thing_totals"
    event_types = ("OrderPaid",)

    def key(self, event_type, event):
        return event["order_id"]

    def apply(self, state, event_type, event):
        return {"n": (state or {"n": 0})["n"] + STEP}

    def contribution(self, state):
        return {"n": state["n"]}
"""


@pytest.fixture
def fold_module(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(code_identity, "_CHECKED", set())
    path = tmp_path / "counting_fold.py"
    path.write_text(FOLD + "\nSTEP = 1\n")
    return path, importlib.import_module("counting_fold")


def test_a_worker_with_the_drivers_code_writes(fold_module):
    _path, module = fold_module
    driver = build_fingerprints(module.Counting())["code_fingerprint"]
    check_executor_code(module.Counting(), driver)  # no error
    check_executor_code(module.Counting(), "")  # unchecked target (tests, tools)


def test_a_worker_that_loaded_the_edited_file_refuses_before_writing(fold_module):
    path, module = fold_module
    driver = build_fingerprints(module.Counting())["code_fingerprint"]
    path.write_text(FOLD + "\nSTEP = 2\n")
    worker = importlib.reload(module)  # a new Spark worker imports the file as it is now
    with pytest.raises(CodeChangedError, match=r"changed on disk.*restart the processor"):
        check_executor_code(worker.Counting(), driver)


def test_a_fingerprint_not_recorded_yet_is_no_change():
    current = {"code_fingerprint": "a", "schema_fingerprints": "{}"}
    assert changed_fingerprints({}, current) == []
    assert changed_fingerprints({"code_fingerprint": "b"}, current) == ["code_fingerprint"]
