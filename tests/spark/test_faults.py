"""The fault suite, small: real processes on private stacks (tests/support/faults.py).

``make soak`` runs the same scenarios big (1M events, 50 kills) and prints the table of
docs/reliability.md.
"""

from __future__ import annotations

import pytest

from tests.support import faults


def _check(result: faults.FaultResult) -> None:
    assert result.lost == 0, result
    assert result.applied_twice == 0, result
    assert result.state_equal, result
    assert result.group_equal, result
    assert all("False" not in note for note in result.notes), result


def test_kill_9_five_times_under_live_traffic_loses_nothing(tmp_path):
    _check(faults.kill_9_soak(tmp_path, orders=3000, kills=5))


def test_redis_restored_from_an_older_rdb_is_refolded_without_new_traffic(tmp_path):
    _check(faults.redis_restored_from_older_backup(tmp_path, orders=1500))


def test_redis_restarted_empty_rebuilds_the_generation(tmp_path):
    _check(faults.redis_restarted_empty(tmp_path, orders=800))


@pytest.mark.timeout(900)
def test_redis_unreachable_for_30_s_is_waited_out(tmp_path):
    _check(faults.redis_unreachable(tmp_path, orders=1200, outage_s=30))


def test_broker_unreachable_for_15_s_is_waited_out(tmp_path):
    _check(faults.broker_unreachable(tmp_path, orders=1000, outage_s=15))


def test_a_broker_killed_under_the_processor_keeps_its_log_and_a_replay_equals_the_oracle(
    tmp_path,
):
    _check(faults.broker_killed(tmp_path, orders=1000, down_s=5))
