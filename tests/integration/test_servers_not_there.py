"""A command run while the broker or Redis is not there says which, where, and what to do."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from refold.contracts.kafka.admin import KafkaUnreachableError, ensure_topics
from refold.contracts.kafka.offsets import LogOffsets, OffsetsError
from refold.contracts.topics import TopicSpec
from refold.deploy.local_stack import free_port


def _run(*argv: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *argv],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )


@pytest.mark.parametrize(
    "argv",
    [
        ("refold.replay", "status"),
        ("refold.deploy.cli", "dlq", "list", "--processor", "order_state"),
    ],
)
def test_a_command_without_redis_names_its_address_and_refold_up(argv):
    port = free_port()  # nothing listens there
    done = _run(*argv, REFOLD_REDIS__URL=f"redis://127.0.0.1:{port}/0")
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert f"cannot reach Redis: Error 111 connecting to 127.0.0.1:{port}" in last
    assert "`refold up`" in last
    assert "REFOLD_REDIS__URL" in last
    assert "Traceback" not in done.stderr


def test_topics_without_a_broker_names_its_address_and_refold_up():
    # What `refold topics` and a processor's start raise (and print on one line) once no
    # broker answered within the call's timeout (30 s there).
    port = free_port()
    spec = TopicSpec("orders-nowhere", 1, "(test)", ("(any)",))
    with pytest.raises(KafkaUnreachableError) as raised:
        ensure_topics({"bootstrap.servers": f"127.0.0.1:{port}"}, [spec], timeout=2)
    message = str(raised.value)
    assert message.startswith(f"[KAFKA_UNREACHABLE] cannot reach Kafka at 127.0.0.1:{port} (")
    assert "`refold up`" in message
    assert "REFOLD_KAFKA__BOOTSTRAP_SERVERS" in message


def test_offsets_without_a_broker_name_its_address_and_refold_up():
    # What `refold tail` and `replay plan` print (OFFSETS_UNAVAILABLE, which their callers
    # catch and some retry): the same words, in the same error as before.
    port = free_port()
    with (
        LogOffsets({"bootstrap.servers": f"127.0.0.1:{port}"}, timeout=2) as offsets,
        pytest.raises(OffsetsError) as raised,
    ):
        offsets.partitions("orders-nowhere")
    message = str(raised.value)
    assert message.startswith(
        f"[OFFSETS_UNAVAILABLE] cannot read metadata of topic orders-nowhere: cannot reach "
        f"Kafka at 127.0.0.1:{port} ("
    )
    assert "`refold up`" in message
