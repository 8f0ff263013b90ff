from refold.contracts.layout import StateLayout, parse_position_field, position_field


def test_generation_keys_share_one_cluster_hash_tag():
    keys = StateLayout("order_state", "refold").generation(3)
    names = [
        keys.meta,
        keys.positions,
        keys.guard("t/0"),
        keys.table("orders", "o-1"),
        keys.aggregate("totals"),
    ]
    tags = {n[n.index("{") : n.index("}") + 1] for n in names}
    assert tags == {"{order_state.g3}"}
    assert keys.table("orders", "o-1") == "refold:{order_state.g3}:t:orders:o-1"


def test_alias_is_outside_generations():
    layout = StateLayout("order_state", "p")
    assert layout.alias == "p:{order_state}:live"  # the registry's own slot on a cluster
    assert layout.generation(1).base != layout.generation(2).base
    assert not layout.generation(1).base.startswith(layout.registry_base)


def test_position_fields_round_trip_topics_with_dots_and_slashes():
    for topic in ("commerce.orders", "a/b", "t-1"):
        assert parse_position_field(position_field(topic, 7)) == (topic, 7)
    assert parse_position_field("batch_id") is None
    # Clocks-hash fields with "|" are no partitions: a stream's clock, a slot's copy.
    assert parse_position_field("order_state.changes/3|order_state|commerce.orders/5") is None
    assert parse_position_field("s0|commerce.orders/3") is None


def test_window_keys_parse_back_whatever_the_group_holds():
    keys = StateLayout("sales_windows", "p").generation(3)
    for group in ("EUR", "a:b:c", "", "ünï:"):
        bucket = keys.window_bucket("per_minute", -60_000, group)
        assert keys.parse_window_bucket(bucket) == ("per_minute", -60_000, group)
        sketch = keys.window_distinct("per_minute", "methods", 120_000, group)
        assert keys.parse_window_distinct(sketch) == ("per_minute", "methods", 120_000, group)
        assert keys.parse_window_bucket(sketch) is None
        assert keys.is_state_key(bucket)
        assert keys.is_state_key(sketch)
    assert keys.parse_window_bucket(keys.table("t", "k")) is None
    assert keys.namespace_pattern("w:") == keys.window_pattern("x").replace("x:*", "*")
