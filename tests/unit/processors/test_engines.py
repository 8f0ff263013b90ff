"""The engine registry: which engine runs each reference processor, and an engine added first."""

from __future__ import annotations

import subprocess
import sys

import pytest

from refold.contracts.registry import default_registry, import_reference
from refold.processors.runtime.cli import load_options
from refold.processors.runtime.engines import (
    Engine,
    QueryStart,
    base as engines_base,
    engine_of,
    register_engine,
)

# Each reference processor's engine. A processor missing here fails the test: say which engine
# a new one runs on.
EXPECTED = {
    "archive": "archive",
    "customer_alerts": "fold",
    "customer_orders": "fold",
    "customer_profiles": "fold",
    "customer_stats": "fold",
    "enriched_clicks": "lookups",
    "order_alerts": "fold",
    "order_state": "fold",
    "sales_native": "dataframe",
    "sales_windows": "windows",
    "search_ctr": "fold",
    "session_stats": "fold",
    "unique_visitors": "windows",
    "web_sessions": "fold",
}


def _projection(name: str) -> object:
    spec = default_registry().processors[name]
    return import_reference(spec.projection)(load_options(spec, {}))


def test_every_reference_processor_runs_on_its_engine() -> None:
    names = sorted(default_registry().processors)
    assert names == sorted(EXPECTED)
    engines = {name: engine_of(_projection(name)).name for name in names}
    assert engines == EXPECTED


def test_the_engines_answer_what_the_runner_asks() -> None:
    # (keyed, dedupes, skips markers, rebuilds on a code change, state in the checkpoint,
    # reads the cold tier, exact ends with refold_kafka, with refold_kafka_ranges)
    answers = {
        name: (
            e.keyed,
            e.dedupes,
            e.skips_markers,
            e.rebuilds_on_code_change,
            e.state_in_checkpoint,
            e.reads_cold_tier,
            e.exact_ends("refold_kafka"),
            e.exact_ends("refold_kafka_ranges"),
        )
        for name in ("order_state", "sales_windows", "enriched_clicks", "sales_native", "archive")
        for e in [engine_of(_projection(name))]
    }
    assert answers == {
        "order_state": (True, True, False, True, False, True, False, True),
        "sales_windows": (True, False, False, True, False, True, False, True),
        "enriched_clicks": (True, False, False, True, False, True, False, True),
        "sales_native": (False, False, True, True, True, True, True, True),
        "archive": (False, False, True, False, False, False, False, True),
    }
    kinds = {n: engine_of(_projection(n)).state_kind(_projection(n)) for n in answers}
    assert kinds == {
        "order_state": "entity",
        "sales_windows": "windows",
        "enriched_clicks": "lookups",
        "sales_native": None,
        "archive": None,
    }
    metas = {n: bool(engine_of(_projection(n)).generation_meta(_projection(n))) for n in answers}
    assert metas == {n: n == "sales_windows" for n in answers}
    topics = {n: engine_of(_projection(n)).result_topics(_projection(n), None) for n in answers}
    assert topics == {n: ["sales_windows.windows"] if n == "sales_windows" else [] for n in answers}


class _Marked:
    name = "marked"


class _MarkedEngine(Engine):
    name = "marked"
    called = "a marked processor"

    def matches(self, projection: object) -> bool:
        return isinstance(projection, _Marked)

    def start(self, start: QueryStart):  # type: ignore[no-untyped-def]
        msg = "the registry's tests look engines up; none starts a query"
        raise AssertionError(msg)


@pytest.fixture
def restored_registry():
    saved = list(engines_base._ADDED)
    engines_base._ADDED[:] = []  # none from another test of this worker (a toy engine's import)
    yield
    engines_base._ADDED[:] = saved


@pytest.mark.usefixtures("restored_registry")
def test_an_engine_registered_later_is_asked_first_and_replaced_by_name() -> None:
    register_engine(_MarkedEngine())
    marked = engine_of(_Marked())  # type: ignore[arg-type]
    assert marked.name == "marked"
    assert (marked.keyed, marked.exact_ends("refold_kafka_ranges")) == (False, False)  # defaults
    assert engine_of(_projection("order_state")).name == "fold"
    again = _MarkedEngine()
    register_engine(again)
    assert engine_of(_Marked()) is again  # type: ignore[arg-type]
    assert [e.name for e in engines_base._ADDED] == ["marked"]


def test_the_extension_api_names_the_engine_registry_and_loads_no_spark() -> None:
    import refold.extend

    assert refold.extend.__all__ == [
        "Engine",
        "QueryStart",
        "RunningSink",
        "SinkTotal",
        "register_engine",
    ]
    assert refold.extend.register_engine is register_engine
    probe = "import sys, refold.extend; print(sorted({'pyspark', 'pyarrow'} & sys.modules.keys()))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
