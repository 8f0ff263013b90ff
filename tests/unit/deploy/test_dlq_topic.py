"""``refold dlq`` and ``refold topics`` name the dead-letter topic the processor sends to."""

from __future__ import annotations

import os

import pytest

from refold.contracts.processors import ProcessorSpec
from refold.deploy.dlq_cli import dead_letter_topic_of
from refold.processors.errors import ProcessorConfigError
from refold.processors.runtime.cli import configured_dead_letter_topic

_SPEC = ProcessorSpec("order_state", "refold.x:y", ("orders",), "order_id", ("orders",))


def test_commands_read_the_processor_s_option_from_the_environment(monkeypatch):
    monkeypatch.delenv("REFOLD_ORDER_STATE__DEAD_LETTER_TOPIC", raising=False)
    assert configured_dead_letter_topic(_SPEC, os.environ) == "order_state.dlq"
    monkeypatch.setenv("REFOLD_ORDER_STATE__DEAD_LETTER_TOPIC", "orders-dead")
    assert configured_dead_letter_topic(_SPEC, os.environ) == "orders-dead"
    # refold dlq list resolves a registered processor the same way
    assert dead_letter_topic_of("order_state", os.environ) == "orders-dead"


def test_refold_dlq_names_the_default_topic_of_a_processor_it_does_not_know(monkeypatch):
    monkeypatch.setenv("REFOLD_NOT_INSTALLED__DEAD_LETTER_TOPIC", "ignored")
    assert dead_letter_topic_of("not_installed", os.environ) == "not_installed.dlq"


def test_an_invalid_option_is_an_error_as_it_is_for_the_processor(monkeypatch):
    monkeypatch.setenv("REFOLD_ORDER_STATE__DEAD_LETER_TOPIC", "typo")
    with pytest.raises(ProcessorConfigError, match="unknown option"):
        dead_letter_topic_of("order_state", os.environ)
