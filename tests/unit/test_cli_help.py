"""The command lines a user meets first: help texts and argument errors."""

import pytest

from deploy.cli import build_parser as refold_parser
from processors.order_state.__main__ import build_parser as processor_parser
from replay.__main__ import build_parser as replay_parser
from replay.__main__ import parse_args as replay_args


@pytest.mark.parametrize(
    ("parser", "words"),
    [
        (refold_parser, ["up", "down", "status", "demo", "process", "replay"]),
        (processor_parser, ["--generation", "--starting-offsets", "--available-now"]),
        (
            replay_parser,
            ["--processor", "--to-earliest", "--from-offset", "--topic", "--execute", "examples"],
        ),
    ],
)
def test_help_mentions_every_command(parser, words, capsys):
    with pytest.raises(SystemExit) as info:
        parser().parse_args(["--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    for word in words:
        assert word in out


def test_replay_plan_help_lists_the_reset_specs(capsys):
    with pytest.raises(SystemExit):
        replay_args(["plan", "--help"])
    out = capsys.readouterr().out
    for word in ("--processor", "--to-earliest", "--from-offset", "--topic", "--execute"):
        assert word in out


def test_replay_needs_exactly_one_reset_spec(capsys):
    with pytest.raises(SystemExit):
        replay_args(["--processor", "order_state"])
    with pytest.raises(SystemExit):
        replay_args(["--processor", "order_state", "--to-earliest", "--from-offset", "3"])
    assert "not allowed with" in capsys.readouterr().err
    args = replay_args(["--processor", "order_state", "--to-offset", "7"])
    assert (args.command, args.from_offset) == ("plan", 7)
    assert replay_args(["status"]).command == "status"
    assert (replay_args(["diff", "--processor", "order_state", "1", "2"]).a) == 1


def test_replay_refuses_negative_offsets_and_unknown_processors(capsys):
    with pytest.raises(SystemExit):
        replay_args(["--processor", "order_state", "--from-offset", "-1"])
    with pytest.raises(SystemExit):
        replay_args(["--processor", "nope", "--to-earliest"])
    assert "invalid choice" in capsys.readouterr().err


def test_processor_generation_argument():
    parse = processor_parser().parse_args
    assert parse([]).generation == "live"
    assert parse(["--generation", "new"]).generation == "new"
    assert parse(["--generation", "4"]).generation == 4
    with pytest.raises(SystemExit):
        parse(["--generation", "latest"])


def test_replay_takes_several_processors_or_all(capsys):
    args = replay_args(["--all", "--to-earliest"])
    assert (args.command, args.all, args.processor) == ("plan", True, None)
    args = replay_args(["--processor", "order_state", "--processor", "order_state", "--to-current"])
    assert args.processor == ["order_state", "order_state"]
    with pytest.raises(SystemExit):
        replay_args(["--all", "--processor", "order_state", "--to-earliest"])
    assert "not allowed with" in capsys.readouterr().err
