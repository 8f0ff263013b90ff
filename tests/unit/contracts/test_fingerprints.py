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


# A user's fold spread over their package: a base class, a helper, its constants, and a
# library of another distribution. The identity must see a change in each (issue 44).
PACKAGE_FILES = {
    "__init__.py": "",
    "constants.py": "RATE = 2\n",
    "pricing.py": "from .constants import RATE\n\n\ndef price(n):\n    return n * RATE\n",
    "base.py": "class Base:\n    def step(self):\n        return 1\n",
    "lazy.py": "def bonus():\n    return 0\n",
    "projection.py": (
        "import json\n"
        "from spread_fold import pricing\n"
        "from spread_fold.base import Base\n\n\n"
        "class Fold(Base):\n"
        "    def apply(self, n):\n"
        "        from spread_fold.lazy import bonus\n"
        "        return pricing.price(n) + self.step() + bonus()\n"
    ),
    "unused.py": "X = 1\n",
}


def _fresh_package(root, files, module="spread_fold.projection"):
    """Write the package and import ``module`` as a new process would (nothing cached)."""
    import importlib
    import sys

    package = root / "spread_fold"
    package.mkdir(exist_ok=True)
    for name, text in files.items():
        (package / name).write_text(text)
    for name in [m for m in sys.modules if m.split(".")[0] == "spread_fold"]:
        del sys.modules[name]
    importlib.invalidate_caches()
    return importlib.import_module(module)


def test_the_fold_modules_are_those_of_its_package_it_depends_on(tmp_path, monkeypatch):
    from refold.contracts.fingerprints import fold_modules

    monkeypatch.syspath_prepend(str(tmp_path))
    fold = _fresh_package(tmp_path, PACKAGE_FILES).Fold
    names = [m.__name__ for m in fold_modules(fold)]
    assert names == [
        "spread_fold",
        "spread_fold.base",
        "spread_fold.constants",
        "spread_fold.lazy",
        "spread_fold.pricing",
    ]  # json is not the package's; unused.py is imported by nothing


def test_a_change_in_any_module_the_fold_depends_on_changes_the_fingerprint(tmp_path, monkeypatch):
    from refold.contracts.fingerprints import fold_modules

    monkeypatch.syspath_prepend(str(tmp_path))

    def fingerprint(**changed: str) -> str:
        fold = _fresh_package(tmp_path, {**PACKAGE_FILES, **changed}).Fold
        return code_fingerprint(fold, *fold_modules(fold))

    before = fingerprint()
    assert fingerprint() == before
    assert fingerprint(**{"unused.py": "X = 2\n"}) == before
    for name, text in [
        ("constants.py", "RATE = 3\n"),
        ("base.py", PACKAGE_FILES["base.py"].replace("return 1", "return 2")),
        ("lazy.py", "def bonus():\n    return 1\n"),
        ("pricing.py", PACKAGE_FILES["pricing.py"].replace("n * RATE", "n * RATE + 1")),
    ]:
        assert fingerprint(**{name: text}) != before, name


def test_declared_code_names_its_version_and_the_installed_distributions(tmp_path, monkeypatch):
    from refold.contracts.fingerprints import DeclaredCode

    dist = tmp_path / "pricing_lib-1.4.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: pricing-lib\nVersion: 1.4\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert DeclaredCode().marker() == ""
    declared = DeclaredCode("7", ("pricing-lib", "no-such-dist"))
    assert declared.marker() == "code_version=7;no-such-dist==not-installed;pricing-lib==1.4"


def test_a_library_fold_configured_in_the_users_factory_module_counts_that_module(
    tmp_path, monkeypatch
):
    # A pattern or window fold is a library class configured by the spec's factory module:
    # the class's module is the library's, the rules are the user's.
    from refold.contracts.fingerprints import fold_modules

    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "generic_folds.py").write_text(
        "class Rules:\n    def __init__(self, n):\n        self.n = n\n"
    )

    def fingerprint(count: int) -> str:
        alerts = _fresh_package(
            tmp_path,
            {
                "__init__.py": "",
                "alerts.py": f"from generic_folds import Rules\n\nCOUNT = {count}\n\n\n"
                "def build(options):\n    return Rules(COUNT)\n",
            },
            "spread_fold.alerts",
        )
        rules = alerts.build(None)
        modules = fold_modules(type(rules), "spread_fold.alerts")
        assert [m.__name__ for m in modules] == ["spread_fold.alerts"]
        return code_fingerprint(type(rules), *modules)

    assert fingerprint(2) == fingerprint(2)
    assert fingerprint(2) != fingerprint(3)
