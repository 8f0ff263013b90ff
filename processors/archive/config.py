"""The archive processor as the platform sees it (``refold.processors`` entry point).

It reads every reference topic (``commerce.orders``, ``web.pageviews``, ``web.searches``,
``crm.customers``) and writes each event, decoded into typed columns, to a Parquet table of its
event type, partitioned by event date, under ``REFOLD_ARCHIVE__ROOT`` (default
``$REFOLD_STATE_DIR/archive``). Exactly once per micro-batch; see docs/archive.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from refold.contracts.commerce import ORDERS
from refold.contracts.processors import ProcessorOptions, ProcessorSpec
from refold.contracts.settings import StackSettings
from refold.contracts.web import CUSTOMERS, PAGEVIEWS, SEARCHES

__all__ = ["ARCHIVE", "ArchiveOptions"]


def _default_root() -> Path:
    """``$REFOLD_ARCHIVE_ROOT``, else ``<state dir>/archive`` (the stack's settings)."""
    return StackSettings().archive_dir


class ArchiveOptions(ProcessorOptions):
    """The archive's options (``REFOLD_ARCHIVE__*``): the common ones and its files'.

    Attributes:
        root: The archive's directory; on a cluster, storage every executor mounts at this
            path (default ``$REFOLD_ARCHIVE_ROOT``, else ``$REFOLD_STATE_DIR/archive``, where
            replays read what the log no longer has).
        compression: Parquet codec. zstd: about half the size of snappy on these events, and
            read by pyarrow, DuckDB and Spark alike.
        fsync: Flush every file to disk before its batch's positions move (off only where a
            power cut may lose the archive anyway, e.g. a benchmark on a throwaway disk).
    """

    root: Path = Field(default_factory=_default_root)
    compression: Literal["zstd", "snappy", "gzip", "lz4", "none"] = "zstd"
    fsync: bool = True


ARCHIVE = ProcessorSpec(
    name="archive",
    projection="refold.processors.archive.projection:build",
    topics=(ORDERS.name, PAGEVIEWS.name, SEARCHES.name, CUSTOMERS.name),
    # No entity: every record is archived as it is, by the task that reads its partition.
    key="(none)",
    tables=(),
    options="refold.processors.archive.config:ArchiveOptions",
    description="every event as Parquet: one table per event type, partitioned by event date",
)
