"""``refold tail TOPIC``: print any topic's records, decoded from their Avro contracts.

Events, output streams, windows (``WindowResult``), insights and dead letters alike: a record in
single-object Avro encoding is decoded with the installed contract sets and shown as JSON;
other values (side effects in JSON, a dead letter's undecodable bytes) are shown as JSON or
text when they are, else as hex. Headers (a dead letter's ``refold.reason``, its origin) are
shown with the record. Reads with ``assign``: no consumer group, nothing committed, nothing
created. Settings: ``REFOLD_KAFKA__*``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, cast

from confluent_kafka import Consumer, KafkaError, Message, TopicPartition

from refold.contracts.cli_parser import CommandParser
from refold.contracts.codec import EventCodec
from refold.contracts.errors import DeserializationError, RefoldError
from refold.contracts.kafka.consumers import passive_consumer
from refold.contracts.kafka.offsets import LogOffsets
from refold.contracts.settings import StackSettings
from refold.contracts.watermarks import is_marker

__all__ = ["TailRecord", "build_parser", "main", "render"]

# Records asked per consume() call; small enough that --limit stops promptly.
_BATCH = 500
# How long a non-following tail waits for records it knows exist before giving up.
_READ_TIMEOUT_S = 30.0


@dataclass(frozen=True, slots=True)
class TailRecord:
    """One record as ``refold tail`` shows it."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    key: str | None
    headers: dict[str, str]
    event_type: str | None  # None: not Avro of a known contract
    value: Any

    def as_dict(self) -> dict[str, Any]:
        """For ``--json``: one object per line."""
        return {
            "topic": self.topic,
            "partition": self.partition,
            "offset": self.offset,
            "timestamp_ms": self.timestamp_ms,
            "key": self.key,
            "headers": self.headers,
            "event_type": self.event_type,
            "value": self.value,
        }


def _text(raw: bytes | None) -> str | None:
    return None if raw is None else raw.decode("utf-8", errors="replace")


def _plain(raw: bytes | None) -> Any:
    """A value that is not Avro: JSON if it parses, else text if it is UTF-8, else hex."""
    if raw is None:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        pass
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return f"<{len(raw)} bytes: {raw[:64].hex()}{'...' if len(raw) > 64 else ''}>"


def decode_record(message: Message, codec: EventCodec) -> TailRecord:
    """A consumed message as a :class:`TailRecord` (Avro decoded when it is Avro)."""
    raw = message.value()
    event_type: str | None = None
    try:
        decoded = codec.decode(raw)
        event_type, value = decoded.event_type, decoded.data
    except DeserializationError:
        value = _plain(raw)
    _kind, timestamp = message.timestamp()
    headers = cast("list[tuple[str, bytes | None]]", message.headers() or [])
    return TailRecord(
        message.topic() or "",
        message.partition() or 0,
        message.offset() or 0,
        timestamp,
        _text(message.key()),
        {name: _text(v) or "" for name, v in headers},
        event_type,
        value,
    )


def render(record: TailRecord) -> str:
    """The human line: origin, time, key, type, value, headers."""
    at = datetime.fromtimestamp(record.timestamp_ms / 1000, UTC).isoformat(timespec="milliseconds")
    value = json.dumps(record.value, default=str, ensure_ascii=False)
    kind = record.event_type or "(not Avro)"
    line = f"{record.topic}/{record.partition}@{record.offset} {at} key={record.key} {kind} {value}"
    if record.headers:
        line += "  [" + " ".join(f"{k}={v}" for k, v in record.headers.items()) + "]"
    return line


def _start_offset(spec: str, start: int, end: int) -> int:
    """``earliest``, ``latest``, ``N`` (an offset) or ``-N`` (the last N) within [start, end]."""
    if spec == "earliest":
        return start
    if spec == "latest":
        return end
    value = int(spec)
    return max(start, end + value) if value < 0 else min(max(value, start), end)


def _from_spec(text: str) -> str:
    if text in ("earliest", "latest") or text.lstrip("-").isdigit():
        return text
    msg = f"expected earliest, latest, an offset N or -N (the last N per partition), got {text!r}"
    raise argparse.ArgumentTypeError(msg)


def build_parser() -> argparse.ArgumentParser:
    """The ``refold tail`` command line."""
    parser = CommandParser(
        prog="refold tail",
        description="Print a topic's records: Avro decoded with the installed contracts "
        "(events, output streams, windows, insights), other values as JSON, text or hex, with "
        "their headers (a dead letter's reason and origin). No consumer group, nothing "
        "committed. Settings: REFOLD_KAFKA__*.",
    )
    parser.add_argument("topic", help="the topic, e.g. commerce.orders or order_state.dlq")
    parser.add_argument(
        "--from",
        dest="start",
        type=_from_spec,
        default="-10",
        help="earliest | latest | OFFSET | -N: the last N per partition (default -10)",
    )
    parser.add_argument(
        "--partition",
        type=int,
        action="append",
        help="only this partition (repeatable; default all)",
    )
    parser.add_argument("--limit", type=int, help="stop after this many records")
    parser.add_argument(
        "-f", "--follow", action="store_true", help="keep printing new records until Ctrl-C"
    )
    parser.add_argument("--json", action="store_true", help="one JSON object per record")
    return parser


def _consumer(config: dict[str, Any]) -> Consumer:
    return passive_consumer(
        config,
        "refold-tail",  # librdkafka wants one; never joined nor committed
        tuning={"fetch.queue.backoff.ms": 10},  # the 1 s default throttles bulk reads ~8x
        # The end is known by position: a transactional topic (dead letters, outputs) ends
        # with a commit or abort marker, which is no record, so no record's offset reaches it.
        eof=True,
    )


def tail(
    config: dict[str, Any],
    topic: str,
    start: str,
    *,
    partitions: list[int] | None = None,
    limit: int | None = None,
    follow: bool = False,
) -> Iterator[TailRecord]:
    """The records of ``topic`` from ``start``, up to the log end taken now (or on, following).

    Raises:
        RefoldError: The topic does not exist or the broker does not answer (OffsetsError).
    """
    with LogOffsets(config) as offsets:
        chosen = partitions if partitions else offsets.partitions(topic)
        tps = [(topic, p) for p in chosen]
        starts, ends = offsets.start_offsets(tps), offsets.end_offsets(tps)
    begin = {tp: _start_offset(start, starts[tp], ends[tp]) for tp in tps}
    todo = {tp for tp in tps if follow or begin[tp] < ends[tp]}
    if not todo or limit == 0:
        return
    codec = EventCodec()
    consumer = _consumer(config)
    consumer.assign([TopicPartition(t, p, begin[(t, p)]) for t, p in sorted(todo)])
    shown, deadline = 0, time.monotonic() + _READ_TIMEOUT_S
    try:
        while todo:
            messages = consumer.consume(_BATCH, timeout=0.5)
            if not messages and not follow and time.monotonic() > deadline:
                msg = f"no records from {sorted(todo)} within {_READ_TIMEOUT_S:.0f}s"
                raise RefoldError(msg)
            for message in messages:
                error = message.error()
                if error is not None:
                    if error.code() != KafkaError._PARTITION_EOF:  # noqa: SLF001
                        raise RefoldError(str(error))
                    if not follow:  # read up to the committed end: markers and aborts passed
                        todo.discard((message.topic() or "", message.partition() or 0))
                    continue
                tp = (message.topic() or "", message.partition() or 0)
                if not follow and (message.offset() or 0) >= ends[tp]:
                    todo.discard(tp)
                    continue
                headers = cast("list[tuple[str, bytes | None]]", message.headers() or [])
                if not is_marker(headers):  # a watermark marker is no record to show
                    yield decode_record(message, codec)
                    shown += 1
                    if limit is not None and shown >= limit:
                        return
                if not follow and (message.offset() or 0) + 1 >= ends[tp]:
                    todo.discard(tp)
            if messages:
                deadline = time.monotonic() + _READ_TIMEOUT_S
    finally:
        consumer.close()


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit code (1: unknown topic or broker error)."""
    args = build_parser().parse_args(argv)
    config = StackSettings().kafka.as_librdkafka()
    try:
        for record in tail(
            config,
            args.topic,
            args.start,
            partitions=args.partition,
            limit=args.limit,
            follow=args.follow,
        ):
            line = json.dumps(record.as_dict(), default=str) if args.json else render(record)
            print(line, flush=True)
    except KeyboardInterrupt:
        return 0
    except RefoldError as exc:
        print(f"refold tail: {exc}", file=sys.stderr)
        return 1
    return 0
