"""refold's public API (``import refold``): the names users write against stay, and stay light.

A name leaving ``refold.__all__`` breaks user code, so removing one must be a deliberate
change of this list. ``import refold`` must not start Spark (a producer app imports it).
"""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import refold

PUBLIC = {
    # declaring a processor and its contracts
    "ProcessorSpec", "ProcessorOptions", "EventTime", "EventId", "StateTtl", "KeyLink",
    "ContractSet",
    "TopicSpec",
    # folds: entities, windows, timers, lookups, patterns, Spark transforms, the archive
    "Projection", "State", "SideEffect", "EventRejectedError", "FoldError", "InvalidOutputError",
    "UnstorableStateError", "WindowFold", "Tumbling", "Hopping", "Sliding", "Measure",
    "TimedFold", "TIMER_EVENT", "LookupFold", "TableRef", "VersionRetention", "add_version",
    "as_of", "EXPIRED", "PatternProjection", "PatternOptions",
    "Sequence", "Absence", "CountWithin", "On", "above", "at_least", "at_most", "below",
    "between", "not_equal", "one_of", "DataFrameProcessor", "ArchiveProcessor", "ArchiveStore",
    "event_time_ms",
    # the oracle (a re-keyed processor's takes its KeyResolver)
    "fold_all", "fold_timed", "fold_windows", "fold_lookups", "FoldResult", "TimedResult",
    "WindowOracle", "KeyResolver",
    # producing and reading
    "EventPublisher", "DeliveryToken", "StateReader", "WindowReader", "RefoldClient",
    "ClientError", "ConsistencyTimeoutError", "InvalidEventsError", "NotFoundError",
    "WebhookDispatcher", "WebhookSettings",
    # settings and errors
    "StackSettings", "KafkaSettings", "RedisSettings", "SparkSettings", "RefoldError",
    "ContractError",
}  # fmt: skip


def test_every_public_name_is_exported_and_resolves() -> None:
    assert set(refold.__all__) == PUBLIC
    assert len(refold.__all__) == len(PUBLIC)  # no name twice
    missing = [name for name in PUBLIC if getattr(refold, name, None) is None]
    assert missing == []


def _loaded_after(statement: str, modules: set[str]) -> list[str]:
    probe = f"import sys; {statement}; print(sorted({modules!r} & sys.modules.keys()))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return ast.literal_eval(done.stdout.strip())


def test_importing_refold_loads_no_public_module_until_a_name_is_used() -> None:
    heavy = {"pyspark", "pyarrow", "fastapi", "uvicorn", "refold.processors.fold.archive"}
    assert _loaded_after("import refold", heavy) == []
    # every refold.* import runs refold/__init__.py: a settings import stays light too
    assert _loaded_after("import refold.contracts.settings", heavy) == []
    assert _loaded_after("from refold import ArchiveProcessor", heavy) == [
        "pyarrow",
        "refold.processors.fold.archive",
    ]


def test_the_type_checkers_imports_name_the_same_modules_as_the_lazy_exports() -> None:
    tree = ast.parse(Path(refold.__file__).read_text())
    guarded = next(n for n in tree.body if isinstance(n, ast.If))  # `if TYPE_CHECKING:`
    imported: dict[str | None, list[str]] = {}
    for node in guarded.body:
        assert isinstance(node, ast.ImportFrom)
        imported.setdefault(node.module, []).extend(alias.name for alias in node.names)
    assert {module: tuple(names) for module, names in imported.items()} == refold._EXPORTS


def test_a_name_refold_does_not_export_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Nothing'"):
        _ = refold.Nothing  # type: ignore[attr-defined]
    assert "fold_all" in dir(refold)
