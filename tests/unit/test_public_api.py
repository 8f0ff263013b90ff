"""refold's public API (``import refold``): the names users write against stay, and stay light.

A name leaving ``refold.__all__`` breaks user code, so removing one must be a deliberate
change of this list. ``import refold`` must not start Spark (a producer app imports it).
"""

import subprocess
import sys

import refold

PUBLIC = {
    # declaring a processor and its contracts
    "ProcessorSpec", "ProcessorOptions", "EventTime", "KeyLink", "ContractSet", "TopicSpec",
    # folds: entities, windows, timers, lookups, patterns, Spark transforms, the archive
    "Projection", "State", "SideEffect", "EventRejectedError", "FoldError", "InvalidOutputError",
    "UnstorableStateError", "WindowFold", "Tumbling", "Hopping", "Sliding", "Measure",
    "TimedFold", "TIMER_EVENT", "LookupFold", "TableRef", "PatternProjection", "PatternOptions",
    "Sequence", "Absence", "CountWithin", "On", "above", "at_least", "at_most", "below",
    "between", "not_equal", "one_of", "DataFrameProcessor", "ArchiveProcessor",
    "event_time_ms",
    # the oracle
    "fold_all", "fold_timed", "fold_windows", "fold_lookups", "FoldResult", "TimedResult",
    "WindowOracle",
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


def test_importing_refold_starts_no_spark_and_no_web_server() -> None:
    heavy = "{'pyspark', 'fastapi', 'uvicorn'}"
    probe = f"import sys, refold; print(sorted({heavy} & sys.modules.keys()))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
