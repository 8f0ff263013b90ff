"""Passive consumer configuration: a user's settings tune a reader, never make it commit."""

from __future__ import annotations

import pickle

from refold.contracts.kafka.consumers import PASSIVE, passive_consumer_config

_USER = {
    "bootstrap.servers": "broker:9092",
    # Every key a user could set to turn a reader into a committing group member:
    "enable.auto.commit": True,
    "enable.auto.offset.store": True,
    "allow.auto.create.topics": True,
    "group.id": "theirs",
    "isolation.level": "read_uncommitted",
    "enable.partition.eof": True,
    "auto.offset.reset": "latest",
}


def test_user_settings_cannot_override_the_passive_keys_or_the_callers_read_semantics():
    config = passive_consumer_config(_USER, "refold-probe")
    assert config == {
        "bootstrap.servers": "broker:9092",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "allow.auto.create.topics": False,
        "group.id": "refold-probe",
        "isolation.level": "read_committed",
        "enable.partition.eof": False,
        "auto.offset.reset": "earliest",
    }


def test_the_callers_choices_are_applied():
    config = passive_consumer_config(
        {"bootstrap.servers": "b:1"},
        "g",
        isolation="read_uncommitted",
        eof=True,
        offset_reset="latest",
    )
    assert config["isolation.level"] == "read_uncommitted"
    assert config["enable.partition.eof"] is True
    assert config["auto.offset.reset"] == "latest"
    assert {k: config[k] for k in PASSIVE} == dict(PASSIVE)


def test_tuning_is_a_default_the_user_may_override():
    tuning = {"fetch.wait.max.ms": 10, "fetch.queue.backoff.ms": 10}
    config = passive_consumer_config({"fetch.wait.max.ms": "500"}, "g", tuning=tuning)
    assert config["fetch.wait.max.ms"] == "500"  # the user's
    assert config["fetch.queue.backoff.ms"] == 10  # the caller's default


def test_tuning_cannot_override_the_passive_keys_either():
    config = passive_consumer_config({}, "g", tuning={"enable.auto.commit": True, "group.id": "x"})
    assert config["enable.auto.commit"] is False
    assert config["group.id"] == "g"


def test_the_config_is_a_new_plain_dict_that_pickles_for_executors():
    user = {"bootstrap.servers": "b:1"}
    config = passive_consumer_config(user, "g", tuning={"fetch.wait.max.ms": 10})
    config["x"] = 1
    assert "x" not in user
    assert pickle.loads(pickle.dumps(config)) == config  # noqa: S301 - our own bytes
