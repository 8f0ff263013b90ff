"""Consistency tokens: "read after these writes", carried from ingest to query.

A token is the set of positions a client needs applied: per ``(topic, partition)`` the offset
after the last record it wrote there. Ingest returns one for a whole request; a query that
carries it (or an explicit ``min_positions``) is answered from the live generation only once
that generation's applied positions reach every partition of the token that the processor
reads. The positions a generation has applied are exact (they are written in the same
transaction as its state), so a query that waited for the token sees the writes, whichever
replica of the service answers.

Format: ``v1.`` + unpadded base64url of compact JSON ``{"<topic>/<partition>": offset}``;
opaque to clients, stable across releases (the version prefix would change otherwise).
``min_positions`` is the readable form: ``<topic>/<partition>:<offset>`` pairs, comma-separated.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable, Mapping

import orjson

from refold.contracts.layout import parse_position_field, position_field
from refold.services.errors import ServiceError

__all__ = [
    "InvalidConsistencyTokenError",
    "decode_token",
    "encode_token",
    "parse_min_positions",
    "positions_after",
    "unmet",
]

_VERSION = "v1."
# Readable-form limit: a token names at most this many partitions (bounds request parsing).
_MAX_PARTITIONS = 10_000

Positions = dict[tuple[str, int], int]


class InvalidConsistencyTokenError(ServiceError):
    """A consistency token or ``min_positions`` could not be read."""

    code = "CONSISTENCY_TOKEN_INVALID"


def positions_after(deliveries: Iterable[tuple[str, int, int]]) -> Positions:
    """The positions that cover ``(topic, partition, offset)`` deliveries: last offset + 1."""
    needed: Positions = {}
    for topic, partition, offset in deliveries:
        tp = (topic, partition)
        needed[tp] = max(needed.get(tp, 0), offset + 1)
    return needed


def encode_token(positions: Mapping[tuple[str, int], int]) -> str:
    """The token of ``positions``."""
    body = {position_field(t, p): o for (t, p), o in sorted(positions.items())}
    return _VERSION + base64.urlsafe_b64encode(orjson.dumps(body)).rstrip(b"=").decode()


def decode_token(token: str) -> Positions:
    """The positions in ``token``.

    Raises:
        InvalidConsistencyTokenError: Not a token this version of refold wrote.
    """
    if not token.startswith(_VERSION):
        msg = f"not a refold consistency token (it starts with {token[:3]!r}, not {_VERSION!r})"
        raise InvalidConsistencyTokenError(msg)
    raw = token[len(_VERSION) :]
    try:
        data = orjson.loads(base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)))
    except (binascii.Error, ValueError) as exc:
        msg = "the consistency token is damaged: pass it on exactly as ingest returned it"
        raise InvalidConsistencyTokenError(msg) from exc
    if not isinstance(data, dict) or len(data) > _MAX_PARTITIONS:
        msg = "the consistency token is damaged: pass it on exactly as ingest returned it"
        raise InvalidConsistencyTokenError(msg)
    return _positions(data.items(), "consistency token")


def parse_min_positions(text: str) -> Positions:
    """``orders/0:120,orders/3:7`` -> ``{("orders", 0): 120, ("orders", 3): 7}``.

    Raises:
        InvalidConsistencyTokenError: A pair is not ``<topic>/<partition>:<offset>``.
    """
    pairs = [item.strip() for item in text.split(",") if item.strip()]
    if len(pairs) > _MAX_PARTITIONS:
        msg = f"min_positions names more than {_MAX_PARTITIONS} partitions"
        raise InvalidConsistencyTokenError(msg)
    split = []
    for pair in pairs:
        field, sep, offset = pair.rpartition(":")
        if not sep:
            msg = f"min_positions: {pair!r} is not <topic>/<partition>:<offset>"
            raise InvalidConsistencyTokenError(msg)
        split.append((field, offset))
    return _positions(split, "min_positions")


def _positions(items: Iterable[tuple[object, object]], what: str) -> Positions:
    positions: Positions = {}
    for field, offset in items:
        parsed = parse_position_field(str(field))
        number = offset if isinstance(offset, int) else None
        if isinstance(offset, str) and offset.isascii() and offset.isdigit():
            number = int(offset)
        if parsed is None or number is None or number < 0 or isinstance(offset, bool):
            msg = f"{what}: {field}:{offset} is not <topic>/<partition>:<offset>"
            raise InvalidConsistencyTokenError(msg)
        positions[parsed] = max(positions.get(parsed, 0), number)
    return positions


def unmet(
    needed: Mapping[tuple[str, int], int],
    applied: Mapping[tuple[str, int], int],
    topics: Iterable[str],
) -> Positions:
    """The needed positions, of the processor's ``topics``, that ``applied`` has not reached.

    Partitions of other topics are left out: a token of a request that wrote to several
    topics is satisfied, for a processor, by the topics it reads.
    """
    read = set(topics)
    return {
        tp: offset for tp, offset in needed.items() if tp[0] in read and applied.get(tp, 0) < offset
    }
