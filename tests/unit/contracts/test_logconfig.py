"""One log format per process: plain lines for people, JSON lines for machines.

Pure logic: records are formatted by the handler ``configure_logging`` installs; uvicorn's
loggers and a Spark worker's (dead-letter summaries) are shown to go through the same one.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import pytest
import redis

from refold.contracts.logconfig import (
    LOG_FORMAT_ENV,
    LOG_LEVEL_ENV,
    add_log_format_argument,
    configure_logging,
    log_format_in_use,
)
from refold.deploy import serve_cli
from refold.processors.runtime.spark_daemon import log_like_the_driver

log = logging.getLogger("refold.test")


@pytest.fixture(autouse=True)
def _restore_root() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:], root.level = handlers, level


def _outage() -> BaseException:
    try:
        msg = "Error 111 connecting to 127.0.0.1:6379. Connection refused."
        raise redis.ConnectionError(msg)
    except redis.ConnectionError as exc:
        return exc


def _lines(capsys: pytest.CaptureFixture[str]) -> list[str]:
    return capsys.readouterr().err.splitlines()


def test_plain_is_one_line_with_time_level_logger_and_context(capsys):
    configure_logging("INFO", log_format="plain")
    log.warning("5 record(s) to orders.dlq", extra={"generation": 3, "batch_id": 7})
    [line] = _lines(capsys)
    date, time, rest = line.split(" ", 2)
    assert len(date) == 10
    assert len(time) == 8
    assert rest == "WARNING refold.test: 5 record(s) to orders.dlq [batch_id=7 generation=3]"


def test_json_is_one_object_per_line_with_the_context_fields(capsys):
    configure_logging("INFO", log_format="json")
    log.info("caught up", extra={"processor": "order_state", "generation": 2})
    [line] = _lines(capsys)
    entry = json.loads(line)
    assert entry["level"] == "INFO"
    assert entry["logger"] == "refold.test"
    assert (entry["msg"], entry["processor"], entry["generation"]) == (
        "caught up",
        "order_state",
        2,
    )


@pytest.mark.parametrize("log_format", ["plain", "json"])
def test_a_warning_keeps_the_exception_in_one_line_not_a_traceback(capsys, log_format):
    configure_logging("INFO", log_format=log_format)
    exc = _outage()
    log.warning("cannot renew the lease of g3", exc_info=exc)
    [line] = _lines(capsys)  # no traceback inside a WARNING line
    assert "Traceback" not in line
    assert "ConnectionError: Error 111 connecting" in line


@pytest.mark.parametrize("log_format", ["plain", "json"])
def test_an_error_keeps_its_traceback(capsys, log_format):
    configure_logging("INFO", log_format=log_format)
    log.error("the processor failed", exc_info=_outage())
    out = capsys.readouterr().err
    if log_format == "json":
        [line] = out.splitlines()
        assert json.loads(line)["exc"].startswith("Traceback")
    else:
        assert "\nTraceback (most recent call last):" in out


def test_the_flag_defaults_to_the_environment_then_plain():
    import argparse

    parser = argparse.ArgumentParser()
    add_log_format_argument(parser, {})
    assert parser.parse_args([]).log_format == "plain"
    parser = argparse.ArgumentParser()
    add_log_format_argument(parser, {LOG_FORMAT_ENV: "json"})
    assert parser.parse_args([]).log_format == "json"
    assert parser.parse_args(["--log-format", "plain"]).log_format == "plain"
    with pytest.raises(ValueError, match="REFOLD_LOG_FORMAT"):
        configure_logging("INFO", log_format="jsonl")


def test_the_format_is_handed_to_the_processes_started_from_here():
    environ: dict[str, str] = {}
    configure_logging("info", log_format="json", environ=environ, record_level=True)
    assert environ == {LOG_FORMAT_ENV: "json", LOG_LEVEL_ENV: "INFO"}
    assert log_format_in_use() == "json"


def test_a_quiet_command_does_not_quiet_the_processes_it_starts():
    # replay logs WARNING and up; the processor it starts (and any later one a test process
    # starts with its environment) must still log its INFO lines.
    environ: dict[str, str] = {}
    configure_logging("WARNING", log_format="plain", environ=environ)
    assert environ == {LOG_FORMAT_ENV: "plain"}


def test_a_spark_worker_logs_dead_letter_summaries_in_the_drivers_format(monkeypatch, capsys):
    logging.getLogger().handlers[:] = []  # a fresh worker: Python's last-resort handler only
    monkeypatch.setenv(LOG_FORMAT_ENV, "json")
    monkeypatch.setenv(LOG_LEVEL_ENV, "INFO")
    log_like_the_driver()
    logging.getLogger("refold.processors.runtime.dead_letters").warning(
        "2 record(s) to orders.dlq: bad-magic 2", extra={"generation": 1}
    )
    [line] = _lines(capsys)
    assert json.loads(line)["msg"] == "2 record(s) to orders.dlq: bad-magic 2"


def test_uvicorn_logs_through_refolds_handler(monkeypatch, capsys):
    import uvicorn

    started: dict[str, object] = {}
    monkeypatch.setattr(serve_cli, "_redis_login_refused", lambda settings: None)
    monkeypatch.setattr(uvicorn, "run", lambda app, **kwargs: started.update(kwargs))
    monkeypatch.setenv(LOG_FORMAT_ENV, "json")
    monkeypatch.delenv(LOG_LEVEL_ENV, raising=False)  # main() records it: restored after
    assert serve_cli.main(["--access-log"]) == 0
    assert started["log_config"] is None  # no handlers of uvicorn's own
    uvicorn.Config(app=lambda: None, log_config=None, access_log=True, log_level="info")
    logging.getLogger("uvicorn.access").info(
        '%s - "%s %s HTTP/%s" %d', "127.0.0.1:5000", "GET", "/health", "1.1", 200
    )
    lines = [json.loads(line) for line in _lines(capsys) if line.startswith("{")]
    assert lines[-1]["logger"] == "uvicorn.access"
    assert lines[-1]["msg"] == '127.0.0.1:5000 - "GET /health HTTP/1.1" 200'
