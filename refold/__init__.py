"""refold's public API: every name a processor, a producer or a reading app writes against.

Import from here (``from refold import ProcessorSpec, Projection, fold_all``). These names
are kept stable across releases; a name that goes away fails ``tests/unit/test_public_api.py``
first. Anything imported from refold's other modules is internal and moves without notice.

- **Declaring a processor**: :class:`ProcessorSpec` (registered under the ``refold.processors``
  entry-point group), its options :class:`ProcessorOptions`, :class:`EventTime`,
  :class:`EventId` (de-duplication), :class:`StateTtl` (state that expires),
  :class:`KeyLink`; contracts as a :class:`ContractSet` (group ``refold.contracts``) of
  :class:`TopicSpec`.
- **Folds** (the state kinds): :class:`Projection` (entities) with :class:`State`,
  :class:`SideEffect` and its errors; windows (:class:`WindowFold` with :class:`Tumbling`,
  :class:`Hopping`, :class:`Sliding`, :class:`Measure`); timers (:class:`TimedFold`,
  :data:`TIMER_EVENT`); lookups and joins (:class:`LookupFold`, :class:`TableRef`, versioned
  tables with :func:`add_version`, :class:`VersionRetention` and :func:`as_of`); patterns
  (:class:`PatternProjection`, :class:`Sequence`, :class:`Absence`, :class:`CountWithin`,
  :class:`On`, conditions such as :func:`above`); Spark transforms
  (:class:`DataFrameProcessor`); the Parquet archive (:class:`ArchiveProcessor`, its files
  read through :class:`ArchiveStore`);
  :func:`event_time_ms`.
- **The oracle**: :func:`fold_all`, :func:`fold_timed`, :func:`fold_windows`,
  :func:`fold_lookups`, a plain-Python fold that live state must equal; a re-keyed
  processor's oracle takes its :class:`KeyResolver`.
- **Producing and reading**: :class:`EventPublisher`, :class:`StateReader`,
  :class:`WindowReader`, the HTTP :class:`RefoldClient` and its errors, webhooks
  (:class:`WebhookDispatcher`, :class:`WebhookSettings`).
- **Settings**: :class:`StackSettings` (``REFOLD_*``) and its parts.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from refold.contracts.extras import needs_extra

# Each public name and the module that defines it. The modules are imported on first use (PEP
# 562), not by ``import refold``: every ``refold.*`` import runs this file, and a producer app
# or a reader must not pay for what processors need (pyarrow, Spark's helpers) or need their
# extras installed. tests/unit/test_public_api.py checks that the block below says the same.
_EXPORTS: dict[str, tuple[str, ...]] = {
    "refold.contracts.errors": ("ContractError", "RefoldError"),
    "refold.contracts.processors": (
        "EventId",
        "EventTime",
        "KeyLink",
        "ProcessorOptions",
        "ProcessorSpec",
        "StateTtl",
    ),
    "refold.contracts.registry": ("ContractSet",),
    "refold.contracts.settings": (
        "KafkaSettings",
        "RedisSettings",
        "SparkSettings",
        "StackSettings",
    ),
    "refold.contracts.topics": ("TopicSpec",),
    "refold.processors.fold.archive": ("ArchiveProcessor",),
    "refold.processors.fold.dataframe": ("DataFrameProcessor",),
    "refold.processors.fold.eventtime": ("event_time_ms",),
    "refold.processors.fold.lookups": (
        "EXPIRED",
        "LookupFold",
        "TableRef",
        "VersionRetention",
        "add_version",
        "as_of",
    ),
    "refold.processors.fold.oracle": (
        "FoldResult",
        "TimedResult",
        "WindowOracle",
        "fold_all",
        "fold_lookups",
        "fold_timed",
        "fold_windows",
    ),
    "refold.processors.fold.patterns": (
        "Absence",
        "CountWithin",
        "On",
        "PatternOptions",
        "PatternProjection",
        "Sequence",
        "above",
        "at_least",
        "at_most",
        "below",
        "between",
        "not_equal",
        "one_of",
    ),
    "refold.processors.fold.projection": (
        "EventRejectedError",
        "FoldError",
        "InvalidOutputError",
        "Projection",
        "SideEffect",
        "State",
        "UnstorableStateError",
    ),
    "refold.processors.fold.rekey": ("KeyResolver",),
    "refold.processors.fold.timers": ("TIMER_EVENT", "TimedFold"),
    "refold.processors.fold.windows": ("Hopping", "Measure", "Sliding", "Tumbling", "WindowFold"),
    "refold.processors.runtime.archive.store": ("ArchiveStore",),
    "refold.services.client": (
        "ClientError",
        "ConsistencyTimeoutError",
        "InvalidEventsError",
        "NotFoundError",
        "RefoldClient",
    ),
    "refold.services.producer.publisher": ("DeliveryToken", "EventPublisher"),
    "refold.services.reader.state_reader": ("StateReader",),
    "refold.services.reader.window_reader": ("WindowReader",),
    "refold.services.webhooks": ("WebhookDispatcher", "WebhookSettings"),
}
__all__ = sorted(name for names in _EXPORTS.values() for name in names)
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}

if TYPE_CHECKING:  # the same names, for type checkers and readers
    from refold.contracts.errors import ContractError as ContractError, RefoldError as RefoldError
    from refold.contracts.processors import (
        EventId as EventId,
        EventTime as EventTime,
        KeyLink as KeyLink,
        ProcessorOptions as ProcessorOptions,
        ProcessorSpec as ProcessorSpec,
        StateTtl as StateTtl,
    )
    from refold.contracts.registry import ContractSet as ContractSet
    from refold.contracts.settings import (
        KafkaSettings as KafkaSettings,
        RedisSettings as RedisSettings,
        SparkSettings as SparkSettings,
        StackSettings as StackSettings,
    )
    from refold.contracts.topics import TopicSpec as TopicSpec
    from refold.processors.fold.archive import ArchiveProcessor as ArchiveProcessor
    from refold.processors.fold.dataframe import DataFrameProcessor as DataFrameProcessor
    from refold.processors.fold.eventtime import event_time_ms as event_time_ms
    from refold.processors.fold.lookups import (
        EXPIRED as EXPIRED,
        LookupFold as LookupFold,
        TableRef as TableRef,
        VersionRetention as VersionRetention,
        add_version as add_version,
        as_of as as_of,
    )
    from refold.processors.fold.oracle import (
        FoldResult as FoldResult,
        TimedResult as TimedResult,
        WindowOracle as WindowOracle,
        fold_all as fold_all,
        fold_lookups as fold_lookups,
        fold_timed as fold_timed,
        fold_windows as fold_windows,
    )
    from refold.processors.fold.patterns import (
        Absence as Absence,
        CountWithin as CountWithin,
        On as On,
        PatternOptions as PatternOptions,
        PatternProjection as PatternProjection,
        Sequence as Sequence,
        above as above,
        at_least as at_least,
        at_most as at_most,
        below as below,
        between as between,
        not_equal as not_equal,
        one_of as one_of,
    )
    from refold.processors.fold.projection import (
        EventRejectedError as EventRejectedError,
        FoldError as FoldError,
        InvalidOutputError as InvalidOutputError,
        Projection as Projection,
        SideEffect as SideEffect,
        State as State,
        UnstorableStateError as UnstorableStateError,
    )
    from refold.processors.fold.rekey import KeyResolver as KeyResolver
    from refold.processors.fold.timers import TIMER_EVENT as TIMER_EVENT, TimedFold as TimedFold
    from refold.processors.fold.windows import (
        Hopping as Hopping,
        Measure as Measure,
        Sliding as Sliding,
        Tumbling as Tumbling,
        WindowFold as WindowFold,
    )
    from refold.processors.runtime.archive.store import ArchiveStore as ArchiveStore
    from refold.services.client import (
        ClientError as ClientError,
        ConsistencyTimeoutError as ConsistencyTimeoutError,
        InvalidEventsError as InvalidEventsError,
        NotFoundError as NotFoundError,
        RefoldClient as RefoldClient,
    )
    from refold.services.producer.publisher import (
        DeliveryToken as DeliveryToken,
        EventPublisher as EventPublisher,
    )
    from refold.services.reader.state_reader import StateReader as StateReader
    from refold.services.reader.window_reader import WindowReader as WindowReader
    from refold.services.webhooks import (
        WebhookDispatcher as WebhookDispatcher,
        WebhookSettings as WebhookSettings,
    )


if not TYPE_CHECKING:  # hidden from type checkers: a misspelt name stays an error there

    def __getattr__(name: str) -> Any:
        """Import a public name's module on first use, and keep the name here."""
        module = _MODULE_OF.get(name)
        if module is None:
            msg = f"module 'refold' has no attribute {name!r}"
            raise AttributeError(msg)
        with needs_extra(f"refold.{name}"):
            value = getattr(importlib.import_module(module), name)
        globals()[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*globals(), *__all__})
