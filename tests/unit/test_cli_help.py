"""The command lines a user meets first: help texts and argument errors."""

import os

import pytest

from refold.deploy.cli import build_parser as refold_parser, main as refold_main
from refold.processors.runtime.cli import build_parser as processor_parser
from refold.replay.__main__ import (
    build_parser as replay_parser,
    main as replay_main,
    parse_args as replay_args,
)


@pytest.mark.parametrize(
    ("parser", "words"),
    [
        (
            refold_parser,
            [
                "up",
                "down",
                "status",
                "demo",
                "process",
                "processors",
                "contracts",
                "topics",
                "replay",
                "webhooks",
                "archive",
            ],
        ),
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
    assert replay_main(["--processor", "nope", "--to-earliest"]) != 0
    err = capsys.readouterr().err
    assert "unknown processor 'nope'" in err
    assert "order_state" in err  # the registered ones are named


def test_processor_generation_argument():
    parse = processor_parser().parse_args
    assert parse(["order_state"]).generation == "live"
    assert parse(["order_state", "--generation", "new"]).generation == "new"
    assert parse(["order_state", "--generation", "4"]).generation == 4
    assert parse(["a", "b", "c"]).names == ["a", "b", "c"]
    with pytest.raises(SystemExit):
        parse(["order_state", "--generation", "latest"])


def test_replay_takes_several_processors_or_all(capsys):
    args = replay_args(["--all", "--to-earliest"])
    assert (args.command, args.all, args.processor) == ("plan", True, None)
    args = replay_args(["--processor", "order_state", "--processor", "order_state", "--to-current"])
    assert args.processor == ["order_state", "order_state"]
    with pytest.raises(SystemExit):
        replay_args(["--all", "--processor", "order_state", "--to-earliest"])
    assert "not allowed with" in capsys.readouterr().err


_STACK_OPTIONS = ["--state-dir", "state-x", "--kafka-port", "29092", "--redis-port", "26379"]


@pytest.mark.parametrize("command", ["up", "down", "status"])
@pytest.mark.parametrize("position", ["before", "after"])
def test_stack_options_before_or_after_the_subcommand(command, position):
    argv = [*_STACK_OPTIONS, command] if position == "before" else [command, *_STACK_OPTIONS]
    args = refold_parser().parse_args(argv)
    assert (args.command, args.state_dir, args.kafka_port, args.redis_port) == (
        command,
        "state-x",
        29092,
        26379,
    )


def test_stack_options_default_from_the_environment_in_both_positions(monkeypatch):
    monkeypatch.setenv("REFOLD_STATE_DIR", "env-state")
    monkeypatch.setenv("REFOLD_KAFKA_PORT", "39092")
    monkeypatch.setenv("REFOLD_REDIS_PORT", "36379")
    parse = refold_parser().parse_args
    for argv in (
        ["status"],
        ["--kafka-port", "1234", "status"],
        ["status", "--kafka-port", "1234"],
    ):
        args = parse(argv)
        expected_kafka = 1234 if "--kafka-port" in argv else 39092
        assert (args.state_dir, args.kafka_port, args.redis_port) == (
            "env-state",
            expected_kafka,
            36379,
        )


def test_the_option_after_the_subcommand_wins():
    args = refold_parser().parse_args(["--redis-port", "1111", "up", "--redis-port", "2222"])
    assert args.redis_port == 2222


def test_stack_help_shows_the_options_after_the_subcommand(capsys):
    with pytest.raises(SystemExit) as info:
        refold_parser().parse_args(["up", "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    for word in ("--state-dir", "--kafka-port", "--redis-port", "REFOLD_KAFKA_PORT"):
        assert word in out


@pytest.mark.parametrize(
    "argv",
    [["up", "--kafka-port", "70000"], ["--redis-port", "0", "up"], ["status", "--redis-port", "x"]],
)
def test_bad_port_is_an_argument_error(argv, capsys):
    with pytest.raises(SystemExit) as info:
        refold_parser().parse_args(argv)
    assert info.value.code == 2
    assert "a TCP port 1-65535" in capsys.readouterr().err


def test_status_reports_the_recorded_ports_and_reads_old_pid_files(tmp_path, capsys):
    stack_dir = tmp_path / "stack"
    stack_dir.mkdir()
    # This test process's pid: alive, but not a Kafka broker or redis-server, so "stopped".
    (stack_dir / "kafka.pid").write_text(f"{os.getpid()} 29092\n")
    (stack_dir / "redis.pid").write_text(f"{os.getpid()}\n")  # written before ports were recorded
    code = refold_main(["status", "--state-dir", str(tmp_path), "--redis-port", "26379"])
    out = capsys.readouterr().out
    assert code == 3
    lines = {line.split()[0]: line for line in out.splitlines()}
    assert "port 29092" in lines["kafka"]
    assert "port 26379" in lines["redis"]  # no recorded port: the option's value
    assert "stopped" in lines["kafka"]
    assert "stopped" in lines["redis"]


def test_a_bad_port_in_the_environment_is_a_usage_error(monkeypatch, capsys):
    monkeypatch.setenv("REFOLD_KAFKA_PORT", "nineteen")
    with pytest.raises(SystemExit) as info:
        refold_parser().parse_args(["status"])
    assert info.value.code == 2
    assert "'nineteen' is not a TCP port 1-65535" in capsys.readouterr().err
