"""Spark's checkpoint offsets log, read by refold's sinks: where each micro-batch starts and ends.

Spark writes a batch's entry (its planned source offsets) before it runs the batch, so a sink
in ``foreachBatch`` can read the exact Kafka ranges of the batch it is applying, whatever the
source: the DataFrame sink records the ends as positions, the fold sink plans its tasks from
them behind refold's ranges source, and closes each range at its end when it reads Spark's JVM
``kafka`` source.
"""

from __future__ import annotations

from pathlib import Path

from refold.contracts.kafka.offsets_json import parse_offsets_json
from refold.contracts.layout import position_field
from refold.processors.errors import ProcessorError
from refold.processors.runtime.checkpoints import checkpoint_files
from refold.processors.runtime.kafka_ranges import Range, batch_ranges_between

__all__ = [
    "batch_end_offsets",
    "batch_ranges",
    "batch_start_offsets",
    "parse_offset_log",
    "planned_ranges",
]


def parse_offset_log(text: str) -> dict[str, int]:
    """The source end offsets in one file of a checkpoint's offsets log, as position fields.

    Spark's format: a version line (``v1``), the batch metadata as JSON, then one line per
    source with its end offset; a DataFrame processor has one source, the last line, which is
    ``{"topic": {"partition": next offset}}``.

    Raises:
        ProcessorError: Not that format.
    """
    return {position_field(t, p): o for (t, p), o in _parse_entry(text).items()}


def _parse_entry(text: str) -> dict[tuple[str, int], int]:
    lines = [line for line in text.splitlines() if line.strip()]
    try:
        if len(lines) < 3 or not lines[0].startswith("v"):
            raise ValueError(lines[:1])
        return parse_offsets_json(lines[-1])
    except ValueError as exc:
        msg = f"not a Spark offsets log entry with a Kafka source's offsets: {exc!r}"
        raise ProcessorError(msg) from exc


def _entry(checkpoint: str | Path, batch_id: int) -> dict[tuple[str, int], int]:
    """The source end offsets of batch ``batch_id``'s entry, per (topic, partition)."""
    return _parse_entry(
        checkpoint_files(str(checkpoint)).read_text(f"{checkpoint}/offsets/{batch_id}")
    )


def planned_ranges(checkpoint: str | Path, batch_id: int) -> list[Range] | None:
    """The non-empty ranges refold's source planned for batch ``batch_id``, from the log.

    The source's own ranges (:func:`batch_ranges_between`) from the previous entry's offsets to
    this entry's. None when the previous entry is not there: a checkpoint's first batch
    (refold's sources keep their initial offsets to themselves).

    Raises:
        ProcessorError: An entry is not in Spark's format.
        OSError: This batch's entry cannot be read.
    """
    if batch_id == 0:
        return None
    try:
        begin = _entry(checkpoint, batch_id - 1)
    except FileNotFoundError:
        return None
    return batch_ranges_between(begin, _entry(checkpoint, batch_id))


def batch_end_offsets(checkpoint: str | Path, batch_id: int) -> dict[str, int]:
    """Where batch ``batch_id`` ends, per partition: its entry in the checkpoint's offsets log.

    Spark writes the entry before it runs the batch (the write-ahead log of the batch's
    ranges), so it exists when ``foreachBatch`` runs, and a re-run batch reads the same.
    """
    return {position_field(t, p): o for (t, p), o in _entry(checkpoint, batch_id).items()}


def batch_start_offsets(checkpoint: str | Path, batch_id: int) -> dict[str, int]:
    """Where batch ``batch_id`` starts, per partition.

    The previous batch's end, or for a checkpoint's first batch the Kafka source's initial
    offsets (``sources/0/0``).

    Raises:
        ProcessorError: The entry is missing or not in Spark's format.
    """
    if batch_id > 0:
        return batch_end_offsets(checkpoint, batch_id - 1)
    # Spark's Kafka source writes a NUL byte, a version line, then the offsets as JSON.
    initial = f"{checkpoint}/sources/0/0"
    try:
        version, nested = (
            checkpoint_files(initial).read_text(initial).lstrip("\x00").splitlines()[:2]
        )
        if not version.startswith("v"):
            raise ValueError(version)
        offsets = parse_offsets_json(nested)
        return {position_field(t, p): o for (t, p), o in offsets.items()}
    except (OSError, ValueError) as exc:
        msg = f"no initial offsets of a Kafka source in {initial}: {exc!r}"
        raise ProcessorError(msg) from exc


def batch_ranges(checkpoint: str | Path, batch_id: int) -> dict[str, tuple[int, int]]:
    """Each partition's ``[start, end)`` in batch ``batch_id`` (new partitions: left out)."""
    ends = batch_end_offsets(checkpoint, batch_id)
    starts = batch_start_offsets(checkpoint, batch_id)
    return {f: (starts[f], end) for f, end in ends.items() if f in starts}
