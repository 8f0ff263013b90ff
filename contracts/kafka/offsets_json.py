"""Kafka offsets in Spark's JSON form, ``{"topic": {"partition": offset}}``: one owner.

The form of ``startingOffsets``, of a Kafka source's offsets (Spark's checkpoint offsets log,
refold's Python source) and of a generation's ``starting_offsets`` meta. Written in one key
order, topics A to Z and partitions by number (``"2"`` before ``"10"``), so equal offsets are
equal strings (Spark compares a source's offsets as JSON). Read strictly where a wrong value is
the user's error to report, leniently where a missing value only means "none recorded".
"""

from __future__ import annotations

import ast
import json
from collections.abc import Mapping

from refold.contracts.kafka.offsets import TopicPartitionKey

__all__ = ["Offsets", "flatten", "nest", "parse_offsets_json", "to_offsets_json"]

Offsets = dict[str, dict[str, int]]


def nest(positions: Mapping[TopicPartitionKey, int]) -> Offsets:
    """``{(topic, partition): offset}`` in the nested form, in the one key order."""
    nested: dict[str, dict[int, int]] = {}
    for (topic, partition), offset in positions.items():
        nested.setdefault(topic, {})[int(partition)] = int(offset)
    return {t: {str(p): o for p, o in sorted(parts.items())} for t, parts in sorted(nested.items())}


def flatten(nested: Mapping[str, Mapping[str, int]]) -> dict[TopicPartitionKey, int]:
    """The nested form as ``{(topic, partition): offset}``.

    Raises:
        ValueError: Not that shape (a partition map that is not a mapping, a non-integer).
    """
    try:
        return {(str(t), int(p)): int(o) for t, parts in nested.items() for p, o in parts.items()}
    except (AttributeError, TypeError, ValueError) as exc:
        msg = f"not Kafka offsets as {{topic: {{partition: offset}}}}: {exc}"
        raise ValueError(msg) from exc


def to_offsets_json(positions: Mapping[TopicPartitionKey, int]) -> str:
    """``positions`` as Spark's offsets JSON (the one key order)."""
    return json.dumps(nest(positions))


def parse_offsets_json(text: str, *, lenient: bool = False) -> dict[TopicPartitionKey, int]:
    """Offsets JSON as ``{(topic, partition): offset}``.

    Args:
        text: The JSON.
        lenient: Return ``{}`` for anything unreadable instead of raising, and also read the
            Python literal PySpark's progress shows for a Python source's offsets (PySpark 4.1
            reports them as the dict's ``repr``, single-quoted).

    Raises:
        ValueError: ``text`` is not offsets JSON (unless ``lenient``).
    """
    try:
        nested = json.loads(text)
    except ValueError:
        if not lenient:
            raise
        try:
            nested = ast.literal_eval(text)  # literals only: no code is evaluated
        except (ValueError, SyntaxError):
            return {}
    if not isinstance(nested, dict):
        if lenient:
            return {}
        msg = f"not Kafka offsets as {{topic: {{partition: offset}}}}: {text[:200]}"
        raise ValueError(msg)
    try:
        return flatten(nested)
    except ValueError:
        if lenient:
            return {}
        raise
