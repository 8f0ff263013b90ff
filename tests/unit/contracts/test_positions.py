"""The owner of a generation's applied positions: parsing, and the keys it names."""

import pytest
import redis

from refold.contracts.layout import BATCH_ID_FIELD, StateLayout
from refold.contracts.store.positions import (
    Applied,
    GenerationPositions,
    parse_fields,
    parse_positions,
)

KEYS = StateLayout("order_state", "p").generation(4)


def test_a_positions_hash_parses_to_partitions_and_the_batch_id():
    raw = {
        b"commerce.orders/0": b"17",
        b"a/b/12": b"3",  # a topic with a slash: the partition is after the last one
        BATCH_ID_FIELD.encode(): b"41",
    }
    applied = parse_positions(raw)
    assert applied == Applied({("commerce.orders", 0): 17, ("a/b", 12): 3}, 41)
    positions, batch_id = applied  # unpacks as the registry's tuple did
    assert (positions, batch_id) == (applied.positions, applied.batch_id)
    # A script's reply decoded to text parses alike.
    assert parse_positions({k.decode(): v.decode() for k, v in raw.items()}) == applied


def test_fields_that_name_no_partition_are_left_out():
    raw = {b"s1|t/0": b"5", b"t/x": b"6", b"t/2": b"7", b"t/0|up|u/1": b"9"}
    assert parse_positions(raw) == Applied({("t", 2): 7}, None)
    assert parse_positions({}) == Applied({}, None)


def test_hmget_replies_keep_only_the_fields_with_a_position():
    fields = ["t/0", "t/1", BATCH_ID_FIELD]
    assert parse_fields(fields, [b"10", None, b"3"]) == {"t/0": 10, BATCH_ID_FIELD: 3}
    assert parse_fields([], []) == {}
    with pytest.raises(ValueError, match=r"shorter|longer"):
        parse_fields(fields, [b"1"])


def test_the_keys_it_names_are_the_generations_positions_hashes():
    plain = GenerationPositions(redis.Redis(), KEYS)
    assert plain.key == KEYS.positions == "p:{order_state.g4}:positions"
    assert plain.watch_keys() == (KEYS.positions,)
    assert plain.writer_key() == plain.writer_key(None) == KEYS.positions
    assert plain.slot_keys() == []
    rekeyed = GenerationPositions(redis.Redis(), KEYS, slots=3)
    assert rekeyed.writer_key(2) == KEYS.slot_positions(2) == "p:{order_state.g4}:slotpos:2"
    assert rekeyed.slot_keys() == [KEYS.slot_positions(s) for s in range(3)]
    # One hash tag: every key a transaction names with them stays in the generation's slot.
    for key in (rekeyed.key, *rekeyed.slot_keys()):
        assert "{order_state.g4}" in key


def test_reads_and_starts_queue_in_the_callers_pipeline():
    rekeyed = GenerationPositions(redis.Redis(), KEYS, slots=2)
    pipe = redis.Redis().pipeline(transaction=True)  # queues only: no server is reached
    rekeyed.queue(pipe)
    rekeyed.start(pipe, "t/0", 8)
    queued = [args for args, _options in pipe.command_stack]
    assert queued == [
        ("HGETALL", KEYS.positions),
        ("HSETNX", KEYS.positions, "t/0", "8"),
        ("HSETNX", KEYS.slot_positions(0), "t/0", "8"),
        ("HSETNX", KEYS.slot_positions(1), "t/0", "8"),
    ]


def test_a_re_keyed_read_refuses_a_caller_s_pipeline():
    """Its slots are read in a transaction of its own, which a caller's WATCH would not cover."""
    owner = GenerationPositions(redis.Redis(), KEYS, slots=2)  # never connects: refused first
    with pytest.raises(ValueError, match="own transaction"):
        owner.read(via=redis.Redis().pipeline())
