"""Who folds a generation: the words status, the monitor and the dashboard show."""

from __future__ import annotations

import json
import os
import socket

from refold.contracts.store.generations import CODE_REFUSED_FIELD, describe_runner, is_abandoned

HERE = socket.gethostname()
ALIVE = f"{HERE}:{os.getpid()}:abcd1234"
GONE = f"{HERE}:999999999:abcd1234"  # no such pid
ELSEWHERE = "other-host:42:abcd1234"  # only its expiry can tell


def test_a_held_lease_is_a_running_processor():
    assert describe_runner("live", ALIVE, {}) == f"running on {HERE}:{os.getpid()}"
    assert describe_runner("building", ELSEWHERE, {}) == "running on other-host:42"


def test_a_building_generation_is_starting_while_its_replay_lives_then_abandoned():
    assert describe_runner("building", None, {}, builder=ALIVE).startswith("starting (replay on")
    assert describe_runner("building", None, {}, builder=GONE).startswith("abandoned")
    assert describe_runner("building", GONE, {}, builder=None).startswith("abandoned")
    assert is_abandoned("building", None, GONE)
    assert not is_abandoned("building", None, ALIVE)
    assert not is_abandoned("building", ALIVE, None)
    assert not is_abandoned("live", None, None)
    assert not is_abandoned("retired", None, None)


def test_a_refusal_by_other_code_says_which_code_it_waits_for():
    meta = {
        "code_fingerprint": "new0000000000000",
        CODE_REFUSED_FIELD: json.dumps({"code_fingerprint": "old0000000000000"}),
    }
    assert describe_runner("live", None, meta) == (
        "waiting for code new0000000000000 (old0000000000000 refused it)"
    )
    assert describe_runner("live", ALIVE, meta).startswith("running on")
    assert describe_runner("retired", None, meta) == "-"
    assert describe_runner("live", None, {}) == "not running"
