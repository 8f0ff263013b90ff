"""The extras: contracts/extras.py agrees with pyproject.toml, and a missing one is named."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from refold.contracts.errors import RefoldError
from refold.contracts.extras import EXTRAS, MissingExtraError, extra_of, needs_extra

PYPROJECT = Path(__file__).resolve().parents[3] / "pyproject.toml"
# distribution name -> import name, where they differ
IMPORT_NAMES = {"prometheus-client": "prometheus_client"}


def _modules(extra: str, table: dict[str, list[str]]) -> set[str]:
    modules: set[str] = set()
    for line in table[extra]:
        requirement = Requirement(line)
        if requirement.name == "refold":  # an extra made of other extras
            for inner in requirement.extras:
                modules |= _modules(inner, table)
        else:
            modules.add(IMPORT_NAMES.get(requirement.name, requirement.name))
    return modules


def _import_absent(module: str) -> None:
    msg = f"No module named {module!r}"
    raise ModuleNotFoundError(msg, name=module)


def test_each_extra_names_the_modules_pyproject_installs_with_it() -> None:
    table = tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"]
    for extra, modules in EXTRAS.items():
        assert set(modules) == _modules(extra, table), extra


def test_a_module_belongs_to_the_smallest_extra_that_installs_it() -> None:
    assert extra_of("pyspark.sql") == "spark"
    assert extra_of("fastapi") == "serve"
    assert extra_of("duckdb") == "local"
    assert extra_of("redis") is None  # a core dependency


def test_a_missing_optional_module_becomes_one_line_that_says_what_to_install() -> None:
    with pytest.raises(MissingExtraError) as caught, needs_extra("refold serve"):
        _import_absent("uvicorn")
    assert str(caught.value) == (
        "[MISSING_EXTRA] refold serve needs refold's 'serve' extra (uvicorn is not installed). "
        "Operator action: pip install 'refold[serve]'"
    )
    assert isinstance(caught.value, ImportError)
    assert isinstance(caught.value, RefoldError)
    with pytest.raises(MissingExtraError, match=r"refold\[local\]"), needs_extra("demo", "local"):
        _import_absent("pyspark")


def test_other_import_errors_pass_unchanged() -> None:
    with pytest.raises(ModuleNotFoundError, match="my_plugin"), needs_extra("refold process"):
        _import_absent("my_plugin")
