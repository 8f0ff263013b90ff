"""The code fingerprint follows what the code does, not how its file is laid out."""

from __future__ import annotations

import inspect
import types
from unittest import mock

from refold.contracts.fingerprints import code_fingerprint


def _fingerprint(source: str) -> str:
    # code_fingerprint reads a module's source through inspect; hand it the text directly.
    with mock.patch.object(inspect, "getsource", return_value=source):
        return code_fingerprint(types.ModuleType("fold_under_test"))


BASE = '''
"""A fold."""
import json
from collections import Counter


def apply(state, event):
    """Add one."""
    return {**state, "n": state["n"] + 1}  # count it
'''


def test_moved_imports_docstrings_comments_and_layout_keep_the_fingerprint():
    moved = """
from collections import Counter

import json


def apply(state, event):
    return {**state, "n": state["n"] + 1}
"""
    assert _fingerprint(BASE) == _fingerprint(moved)


def test_a_changed_statement_or_constant_changes_it():
    assert _fingerprint(BASE) != _fingerprint(BASE.replace("+ 1", "+ 2"))
    assert _fingerprint(BASE) != _fingerprint(BASE.replace('"n"]', '"m"]'))


def test_a_process_keeps_the_fingerprint_of_the_code_it_loaded(tmp_path, monkeypatch):
    # A running processor fingerprints its code again when it follows a cutover: reading the
    # file as it is then gave the fingerprint of code the process does not run.
    import importlib

    monkeypatch.syspath_prepend(str(tmp_path))
    source = tmp_path / "fold_loaded_once.py"
    source.write_text("def apply(state):\n    return state\n")
    module = importlib.import_module("fold_loaded_once")
    loaded = code_fingerprint(module.apply, "layout-v1")
    source.write_text("def apply(state):\n    return {**state, 'x': 1}\n")  # edited under it
    assert code_fingerprint(module.apply, "layout-v1") == loaded
    assert code_fingerprint(importlib.reload(module).apply, "layout-v1") != loaded
