"""refold's public API: every name a processor, a producer or a reading app writes against.

Import from here (``from refold import ProcessorSpec, Projection, fold_all``). These names
are kept stable across releases; a name that goes away fails ``tests/unit/test_public_api.py``
first. Anything imported from refold's other modules is internal and moves without notice.

- **Declaring a processor**: :class:`ProcessorSpec` (registered under the ``refold.processors``
  entry-point group), its options :class:`ProcessorOptions`, :class:`EventTime`,
  :class:`KeyLink`; contracts as a :class:`ContractSet` (group ``refold.contracts``) of
  :class:`TopicSpec`.
- **Folds** (the state kinds): :class:`Projection` (entities) with :class:`State`,
  :class:`SideEffect` and its errors; windows (:class:`WindowFold` with :class:`Tumbling`,
  :class:`Hopping`, :class:`Sliding`, :class:`Measure`); timers (:class:`TimedFold`,
  :data:`TIMER_EVENT`); lookups and joins (:class:`LookupFold`, :class:`TableRef`); patterns
  (:class:`PatternProjection`, :class:`Sequence`, :class:`Absence`, :class:`CountWithin`,
  :class:`On`, conditions such as :func:`above`); Spark transforms
  (:class:`DataFrameProcessor`); the Parquet archive (:class:`ArchiveProcessor`);
  :func:`event_time_ms`.
- **The oracle**: :func:`fold_all`, :func:`fold_timed`, :func:`fold_windows`,
  :func:`fold_lookups`, a plain-Python fold that live state must equal.
- **Producing and reading**: :class:`EventPublisher`, :class:`StateReader`,
  :class:`WindowReader`, the HTTP :class:`RefoldClient` and its errors, webhooks
  (:class:`WebhookDispatcher`, :class:`WebhookSettings`).
- **Settings**: :class:`StackSettings` (``REFOLD_*``) and its parts.
"""

from __future__ import annotations

from contracts.errors import ContractError, RefoldError
from contracts.processors import EventTime, KeyLink, ProcessorOptions, ProcessorSpec
from contracts.registry import ContractSet
from contracts.settings import KafkaSettings, RedisSettings, SparkSettings, StackSettings
from contracts.topics import TopicSpec
from processors.fold.archive import ArchiveProcessor
from processors.fold.dataframe import DataFrameProcessor
from processors.fold.eventtime import event_time_ms
from processors.fold.lookups import LookupFold, TableRef
from processors.fold.oracle import (
    FoldResult,
    TimedResult,
    WindowOracle,
    fold_all,
    fold_lookups,
    fold_timed,
    fold_windows,
)
from processors.fold.patterns import (
    Absence,
    CountWithin,
    On,
    PatternOptions,
    PatternProjection,
    Sequence,
    above,
    at_least,
    at_most,
    below,
    between,
    not_equal,
    one_of,
)
from processors.fold.projection import (
    EventRejectedError,
    FoldError,
    InvalidOutputError,
    Projection,
    SideEffect,
    State,
    UnstorableStateError,
)
from processors.fold.timers import TIMER_EVENT, TimedFold
from processors.fold.windows import Hopping, Measure, Sliding, Tumbling, WindowFold
from services.client import (
    ClientError,
    ConsistencyTimeoutError,
    InvalidEventsError,
    NotFoundError,
    RefoldClient,
)
from services.producer.publisher import DeliveryToken, EventPublisher
from services.reader.state_reader import StateReader
from services.reader.window_reader import WindowReader
from services.webhooks import WebhookDispatcher, WebhookSettings

__all__ = [
    "TIMER_EVENT",
    "Absence",
    "ArchiveProcessor",
    "ClientError",
    "ConsistencyTimeoutError",
    "ContractError",
    "ContractSet",
    "CountWithin",
    "DataFrameProcessor",
    "DeliveryToken",
    "EventPublisher",
    "EventRejectedError",
    "EventTime",
    "FoldError",
    "FoldResult",
    "Hopping",
    "InvalidEventsError",
    "InvalidOutputError",
    "KafkaSettings",
    "KeyLink",
    "LookupFold",
    "Measure",
    "NotFoundError",
    "On",
    "PatternOptions",
    "PatternProjection",
    "ProcessorOptions",
    "ProcessorSpec",
    "Projection",
    "RedisSettings",
    "RefoldClient",
    "RefoldError",
    "Sequence",
    "SideEffect",
    "Sliding",
    "SparkSettings",
    "StackSettings",
    "State",
    "StateReader",
    "TableRef",
    "TimedFold",
    "TimedResult",
    "TopicSpec",
    "Tumbling",
    "UnstorableStateError",
    "WebhookDispatcher",
    "WebhookSettings",
    "WindowFold",
    "WindowOracle",
    "WindowReader",
    "above",
    "at_least",
    "at_most",
    "below",
    "between",
    "event_time_ms",
    "fold_all",
    "fold_lookups",
    "fold_timed",
    "fold_windows",
    "not_equal",
    "one_of",
]
