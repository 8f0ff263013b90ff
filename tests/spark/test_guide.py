"""docs/write-your-own-processor.md, followed literally.

Every ``file=...`` block of the guide is written under a fresh project folder, and every
``bash run`` and ``python run`` block is run there, in document order, as separate processes
with the guide's environment pointed at the test's broker and Redis (a unique key prefix, a
private state dir). Like the guide's user, the steps run in a virtualenv of their own, where
refold is the wheel built from this checkout, installed with the ``spark`` extra (and pytest):
nothing is imported from the source tree. Then: the processor is listed, the state read back
equals ``fold_all`` (the oracle) of the events on the topic, in both generations, and
``replay status`` shows generation 1 retired and generation 2 live.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from refold.contracts.kafka.admin import delete_topics
from refold.contracts.settings import KafkaSettings
from tests.support.wheel import fresh_venv

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "write-your-own-processor.md"
PROCESSOR = "product_ratings"
# The topics the guide's processor reads and writes. The session's broker is private to this
# test run and no other test uses these names; they are deleted afterwards.
TOPICS = ("shop.reviews", "product_ratings.dlq")
# The one install the guide asks for: the user's package, editable, into the user's venv.
INSTALL = "pip install -e ."
# Spark's start (~6 s), a few micro-batches, or a whole rebuild: generous on 2 busy cores.
STEP_TIMEOUT_S = 240
# SIGTERM first (replay then stops its rebuild processor), SIGKILL after this.
STOP_GRACE_S = 40

_FENCE = re.compile(r"^```(?P<lang>[A-Za-z0-9_+-]*)(?P<info>.*)$")


@dataclass(frozen=True, slots=True)
class Block:
    """A fenced code block of the guide that the test writes (``file=``) or runs (``run``)."""

    lang: str
    target: str  # "run" or a file path relative to the project
    text: str
    line: int


def parse_guide(text: str) -> list[Block]:
    """The guide's ``file=`` and ``run`` blocks, in document order."""
    blocks: list[Block] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        match = _FENCE.match(lines[i])
        if match is None:
            i += 1
            continue
        start = i
        body: list[str] = []
        i += 1
        while i < len(lines) and lines[i].rstrip() != "```":
            body.append(lines[i])
            i += 1
        i += 1
        words = match["info"].split()
        files = [w.removeprefix("file=") for w in words if w.startswith("file=")]
        if "run" in words:
            blocks.append(Block(match["lang"], "run", "\n".join(body) + "\n", start + 1))
        elif files:
            blocks.append(Block(match["lang"], files[0], "\n".join(body) + "\n", start + 1))
    return blocks


def _bash(block: Block) -> str:
    """The block as a bash script; the only install it may hold is :data:`INSTALL`."""
    for line in block.text.splitlines():
        if "pip install" in line and line.strip() != INSTALL:
            msg = f"guide line {block.line}: unexpected install command {line!r}"
            raise AssertionError(msg)
    return block.text


def _run(argv: list[str], *, cwd: Path, env: dict[str, str], log: Path) -> tuple[int, str]:
    """Run a step in its own process group; its output (stdout + stderr) goes to ``log``."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as out:
        process = subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            code = process.wait(STEP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            for sig, wait in ((signal.SIGTERM, STOP_GRACE_S), (signal.SIGKILL, None)):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, sig)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(wait)
                    break
            code = -1
    return code, log.read_text(errors="replace")


# Run with the guide's environment: the oracle of the events on the processor's topics, and
# the state of each generation read back through StateReader, as JSON.
_ORACLE = """
import json, os, sys, time
from confluent_kafka import Consumer, TopicPartition
from refold.contracts.codec import EventCodec
from refold.contracts.kafka.offsets import LogOffsets
from refold.contracts.processors import ProcessorOptions
from refold.contracts.registry import default_registry, import_reference
from refold.contracts.settings import KafkaSettings
from refold.processors.fold.oracle import fold_all
from refold.services.reader.state_reader import StateReader

name = sys.argv[1]
spec = default_registry().processor(name)
options = import_reference(spec.options)() if spec.options else ProcessorOptions()
projection = import_reference(spec.projection)(options)
kafka = KafkaSettings(bootstrap_servers=os.environ["REFOLD_KAFKA__BOOTSTRAP_SERVERS"])
codec = EventCodec()
events = []
consumer = Consumer({**kafka.as_librdkafka(), "group.id": "guide-oracle",
                     "enable.auto.commit": "false", "fetch.queue.backoff.ms": "10"})
with LogOffsets(kafka.as_librdkafka()) as offsets:
    tps = [(t, p) for t in spec.topics for p in offsets.partitions(t)]
    ends = offsets.end_offsets(tps)
    dead_letters = sum(offsets.end_offsets([(f"{name}.dlq", 0)]).values())
for (topic, partition), end in sorted(ends.items()):
    consumer.assign([TopicPartition(topic, partition, 0)])
    deadline, position = time.monotonic() + 60, 0
    while position < end and time.monotonic() < deadline:
        for message in consumer.consume(1000, timeout=0.5):
            if message.error() is None:
                decoded = codec.decode(message.value())
                events.append((decoded.event_type, decoded.data))
                position = message.offset() + 1
    assert position == end, f"{topic}/{partition}: read up to {position} of {end}"
consumer.close()
expected = fold_all(projection, events)
reader = StateReader.from_url(
    os.environ["REFOLD_REDIS__URL"], name, os.environ["REFOLD_REDIS__KEY_PREFIX"]
)
generations = {
    g: {
        "states": dict(reader.scan(spec.tables[0], g)),
        "aggregate": reader.aggregate(spec.aggregates[0], g).value,
    }
    for g in (1, 2)
}
print(json.dumps({
    "events": len(events),
    "dead_letters": dead_letters,
    "expected": {"states": expected.states, "aggregate": dict(expected.aggregate),
                 "rejected": len(expected.rejected)},
    "generations": generations,
    "live": reader.live_generation(),
}))
"""


def test_the_guide_runs_as_written_and_its_state_equals_the_oracle(
    kafka_bootstrap, redis_url, unique, tmp_path: Path
):
    blocks = parse_guide(GUIDE.read_text())
    files = {b.target for b in blocks if b.target != "run"}
    assert {"pyproject.toml", "shop_insights/config.py", "shop_insights/projection.py"} <= files
    project, state_dir = tmp_path / "shop-insights", tmp_path / "state"
    project.mkdir()
    bin_dir = fresh_venv(tmp_path / "venv", ("spark",), "pytest")
    python = str(bin_dir / "python")
    kafka = KafkaSettings(bootstrap_servers=kafka_bootstrap)
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("REFOLD_", "PYSPARK_")) and k not in ("PYTHONPATH", "VIRTUAL_ENV")
    }
    env.update(
        # refold, replay, python, pip: the fresh virtualenv's, as for a user who activated it.
        PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        VIRTUAL_ENV=str(bin_dir.parent),
        REFOLD_KAFKA__BOOTSTRAP_SERVERS=kafka_bootstrap,
        REFOLD_REDIS__URL=redis_url,
        REFOLD_REDIS__KEY_PREFIX=f"guide-{unique}",
        REFOLD_STATE_DIR=str(state_dir),
    )
    existing = AdminClient(kafka.as_librdkafka()).list_topics(timeout=30).topics
    taken = [t for t in TOPICS if t in existing]
    assert not taken, f"{taken} exist on this broker already (another run?); not touching them"
    outputs: list[tuple[Block, str]] = []
    try:
        for step, block in enumerate(blocks, start=1):
            if block.target != "run":
                path = project / block.target
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(block.text)
                continue
            log = tmp_path / "logs" / f"step-{step:02d}-line-{block.line}.log"
            if block.lang == "bash":
                argv = ["bash", "-euo", "pipefail", "-c", _bash(block)]
            elif block.lang == "python":
                script = tmp_path / "snippets" / f"step-{step:02d}.py"
                script.parent.mkdir(exist_ok=True)
                script.write_text(block.text)
                argv = [python, str(script)]
            else:
                pytest.fail(f"guide line {block.line}: cannot run a {block.lang!r} block")
            code, output = _run(argv, cwd=project, env=env, log=log)
            assert code == 0, (
                f"guide line {block.line} ({block.lang} run) exited {code}:\n"
                f"{block.text}\n--- output (last 4000 chars) ---\n{output[-4000:]}"
            )
            outputs.append((block, output))

        def output_of(command: str) -> str:
            return next(out for block, out in outputs if command in block.text)

        assert "3 passed" in output_of("pytest")
        assert "published ReviewPosted v1" in output_of("refold contracts lock")
        assert f"{PROCESSOR}  [shop-insights 0.1.0]" in output_of("refold processors")
        assert "generation 1: p-0007 has" in output_of("StateReader")
        status = output_of("replay status")
        rows = dict(re.findall(rf"^{PROCESSOR}\s+(\d+)\s+(\w+)", status, flags=re.MULTILINE))
        assert rows == {"1": "retired", "2": "live"}, status

        oracle_log = tmp_path / "logs" / "oracle.log"
        code, output = _run(
            [python, "-c", _ORACLE, PROCESSOR], cwd=project, env=env, log=oracle_log
        )
        assert code == 0, output[-4000:]
        result = json.loads(output.strip().splitlines()[-1])
        expected = result["expected"]
        assert result["events"] == 2_001
        assert expected["rejected"] == 1  # the review off the scale
        assert result["dead_letters"] >= 1
        assert len(expected["states"]) == 50
        assert result["live"] == 2
        for generation, got in result["generations"].items():
            assert got["states"] == expected["states"], f"generation {generation}"
            assert got["aggregate"] == expected["aggregate"], f"generation {generation}"
    finally:
        # Cleanup must not mask the test's outcome.
        with contextlib.suppress(Exception):
            delete_topics(kafka.as_librdkafka(), TOPICS)
