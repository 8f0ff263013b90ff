"""A mistyped flag or command is named with the closest known spelling."""

import pytest

from refold.deploy.cli import main as refold
from refold.processors.runtime.cli import build_parser as process_parser
from refold.replay.__main__ import parse_args as replay_args


def _error(capsys, call) -> str:
    with pytest.raises(SystemExit) as exit_info:
        call()
    assert exit_info.value.code == 2
    return capsys.readouterr().err


def test_a_mistyped_flag_is_named_with_a_suggestion(capsys):
    err = _error(capsys, lambda: process_parser().parse_args(["order_state", "--availble-now"]))
    assert "unrecognized arguments: --availble-now (did you mean --available-now?)" in err


def test_a_mistyped_required_flag_says_what_it_may_have_meant(capsys):
    err = _error(capsys, lambda: replay_args(["--proccessor", "order_state"]))
    assert "did you mean --processor?" in err


def test_a_mistyped_command_is_named_with_a_suggestion(capsys):
    assert "did you mean status?" in _error(capsys, lambda: replay_args(["stauts"]))
    assert "did you mean status?" in _error(capsys, lambda: refold(["stauts"]))


def test_a_subcommand_option_is_suggested_from_the_top_parser(capsys):
    err = _error(capsys, lambda: refold(["up", "--kafka-prot", "1"]))
    assert "did you mean --kafka-port?" in err
