"""A generation catching up from far behind the log, as readers judge it (pure)."""

from refold.contracts.store.catch_up import CatchUp, catch_up_target, target_field

T0, T1 = ("orders", 0), ("orders", 1)


def test_the_target_is_the_log_end_of_each_partition_started_behind():
    assert catch_up_target({T0: 0, T1: 7}, {T0: 10, T1: 7}) == {T0: 10}
    assert target_field({T0: 0, T1: 7}, {T0: 10, T1: 7}) == '{"orders": {"0": 10}}'
    assert target_field({T0: 10}, {T0: 10}) is None  # started at the end: nothing to catch up


def test_rebuilding_until_every_partition_read_reaches_the_target():
    state = CatchUp.parse(b'{"orders": {"0": 10, "1": 4}}')
    assert state.behind({T0: 3, T1: 4}) == {T0: 10}
    assert state.behind({}) == {T0: 10, T1: 4}  # nothing applied yet
    assert state.behind({T1: 4}) is None  # a sharded read of partition 1: caught up there
    assert state.behind({T0: 10, T1: 9}) is None
    assert state.behind({T0: 12, T1: 5}) is None  # normal lag later is not a rebuild


def test_pending_is_rebuilding_and_no_field_never_is():
    assert CatchUp.parse("pending").behind({T0: 100}) == {}
    assert CatchUp.parse(None).behind({}) is None
    assert CatchUp.parse(b"not json").behind({}) is None
