"""refold status's verdict: which part of the local stack is down, and the exit code (pure)."""

from pathlib import Path

from refold.deploy.local_stack import ServerStatus
from refold.deploy.stack_status import EXIT_NOTHING_RUNS, EXIT_PART_DOWN, stack_verdict


def _server(name, port, *, running=True):
    return ServerStatus(name, port, 100 + port % 100 if running else None, running, Path("x.log"))


def test_every_server_up_is_0():
    verdict = stack_verdict([_server("kafka", 19092), _server("redis", 16379)], lambda _p: True)
    assert verdict.exit_code == 0
    assert verdict.states == ("running (pid 192)", "running (pid 179)")
    assert verdict.down == ()
    assert verdict.message() == ""


def test_redis_down_with_kafka_up_is_named_and_exits_6():
    servers = [_server("kafka", 19092), _server("redis", 16379, running=False)]
    verdict = stack_verdict(servers, lambda _p: True)
    assert verdict.exit_code == EXIT_PART_DOWN == 6
    assert verdict.states == ("running (pid 192)", "stopped")
    assert verdict.message("refold up --state-dir /s") == (
        "refold status: down: redis (port 16379). Operator action: refold up --state-dir /s "
        "(it starts what is down; what runs is left as it is)"
    )


def test_a_process_that_does_not_listen_is_down():
    servers = [_server("kafka", 19092), _server("redis", 16379)]
    verdict = stack_verdict(servers, lambda port: port != 19092)
    assert verdict.exit_code == EXIT_PART_DOWN
    assert verdict.states[0] == "not answering (pid 192)"
    assert verdict.down == ("kafka (port 19092)",)


def test_one_cluster_node_down_is_named():
    nodes = [_server("redis", p, running=p != 7002) for p in range(7000, 7006)]
    verdict = stack_verdict([_server("kafka", 19092), *nodes], lambda _p: True)
    assert verdict.exit_code == EXIT_PART_DOWN
    assert verdict.down == ("redis (port 7002)",)


def test_nothing_running_keeps_exit_3():
    servers = [_server("kafka", 19092, running=False), _server("redis", 16379, running=False)]
    verdict = stack_verdict(servers, lambda _p: True)
    assert verdict.exit_code == EXIT_NOTHING_RUNS == 3
    assert verdict.down == ("kafka (port 19092)", "redis (port 16379)")
    assert "the local stack is stopped" in verdict.message()
