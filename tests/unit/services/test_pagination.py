"""The scan cursor: opaque text naming processor, table, generation, shard and SCAN cursor."""

import base64
import json

import pytest

from refold.services.api.errors import ApiError
from refold.services.query.pagination import ScanCursor


def _raw(body: list) -> str:
    return "c1." + base64.urlsafe_b64encode(json.dumps(body).encode()).rstrip(b"=").decode()


def test_a_cursor_round_trips_with_its_shard():
    cursor = ScanCursor("order_state", "orders", 3, 2**63, 5)
    assert ScanCursor.decode(cursor.encode(), "order_state", "orders") == cursor


def test_a_cursor_written_before_shards_is_of_shard_0():
    old = _raw(["order_state", "orders", 3, 17])
    assert ScanCursor.decode(old, "order_state", "orders") == ScanCursor(
        "order_state", "orders", 3, 17, 0
    )


@pytest.mark.parametrize(
    "body",
    [
        ["order_state", "orders", 3, 17, -1],
        ["order_state", "orders", 3, 17, 2**64],
        ["order_state", "orders", 3, 17, 0, 0],
        ["order_state", "orders", 3, 17, "x"],
        ["order_state", "orders", 0, 17, 0],
        ["order_state", "orders", 3],
    ],
)
def test_a_cursor_that_is_none_of_this_scan_is_refused(body):
    with pytest.raises(ApiError) as refused:
        ScanCursor.decode(_raw(body), "order_state", "orders")
    assert (refused.value.status, refused.value.code) == (400, "CURSOR_INVALID")


def test_a_cursor_of_another_table_is_refused():
    cursor = ScanCursor("order_state", "orders", 3, 0, 1).encode()
    with pytest.raises(ApiError, match="order_state/orders, not order_state/customers"):
        ScanCursor.decode(cursor, "order_state", "customers")
