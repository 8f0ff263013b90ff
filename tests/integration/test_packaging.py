"""refold as a user installs it: one top-level package, ``refold``, from a wheel or editable.

The folders the design fixes (``contracts/ services/ processors/ replay/ deploy/``) install as
``refold.contracts`` and so on; a user's own ``services`` or ``contracts`` package must never be
shadowed by refold's.
"""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from refold.contracts.codec import EventCodec
from refold.processors.fold.oracle import fold_all
from refold.processors.fold.records import SourceRecord
from refold.processors.order_state.projection import OrderStateProjection
from refold.processors.runtime.envelope import FoldTarget, FoldWriter
from tests.support.topics import read_to_end
from tests.support.wheel import fresh_venv, session_wheel

FOLDERS = ("contracts", "services", "processors", "replay", "deploy")


@pytest.fixture(scope="module")
def wheel() -> Path:
    return session_wheel()


def test_the_wheel_installs_one_top_level_package_with_its_data(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names}
    assert {top for top in tops if not top.endswith(".dist-info")} == {"refold"}
    for folder in FOLDERS:
        assert f"refold/{folder}/__init__.py" in names
    assert "refold/py.typed" in names  # user code type-checks against refold's hints
    assert "refold/contracts/schemas/commerce/OrderPlaced.v1.avsc" in names
    assert "refold/contracts/schemas/commerce/contracts.lock" in names
    assert any(name.startswith("refold/services/dashboard/static/") for name in names)


def test_every_entry_point_of_the_wheel_names_a_refold_module(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        (entry_points,) = (n for n in archive.namelist() if n.endswith("entry_points.txt"))
        lines = archive.read(entry_points).decode().splitlines()
    targets = [line.split("=", 1)[1].strip() for line in lines if "=" in line]
    assert targets  # the two commands, the contracts and the processors
    assert [t for t in targets if not t.startswith("refold.")] == []


def test_outside_the_checkout_only_refold_is_importable(tmp_path: Path) -> None:
    # The editable install of this checkout, from a directory that is not the checkout.
    probe = (
        "import importlib.util as u, sys; import refold.contracts.settings, refold.replay.plan; "
        f"print([n for n in {FOLDERS!r} if u.find_spec(n) is not None])"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


# Run in the venv without extras: publish orders through the SDK, from `refold` names only.
_PUBLISH = """
import json, sys
from refold import EventPublisher, KafkaSettings, TopicSpec
from refold.contracts.commerce import ORDERS
from refold.deploy.simulators.orders import OrderSimulator

bootstrap, topic = sys.argv[1], sys.argv[2]
spec = TopicSpec(topic, 4, "order_id", ORDERS.event_types)
events = list(OrderSimulator(60, seed=5, anomaly_rate=0))
publisher = EventPublisher(KafkaSettings(bootstrap_servers=bootstrap), topics=[spec])
tokens = publisher.emit_many(events)
publisher.close()
print(json.dumps({"published": len(tokens)}))
"""
# ...and read the state a processor folded, through the live reader.
_READ = """
import json, sys
from refold import StateReader
reader = StateReader.from_url(sys.argv[1], "order_state", sys.argv[2])
print(json.dumps(dict(reader.scan("orders", generation=1)), sort_keys=True))
"""
_ABSENT = "pyspark", "pyarrow", "pandas", "fastapi", "uvicorn", "prometheus_client"


def _records(bootstrap: str, topic: str, partitions: int) -> list[SourceRecord]:
    found = read_to_end(bootstrap, topic)
    assert {m.partition() for m in found} <= set(range(partitions))
    return [SourceRecord(topic, m.partition(), m.offset(), m.key(), m.value()) for m in found]


def test_without_extras_a_venv_publishes_and_reads_and_names_the_extra_it_lacks(
    tmp_path: Path, kafka_bootstrap, redis_url, make_topic, target: FoldTarget
):
    bin_dir = fresh_venv(tmp_path / "venv")
    python = str(bin_dir / "python")

    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=120)

    probe = run(
        python,
        "-c",
        f"import importlib.util as u; print([m for m in {_ABSENT!r} if u.find_spec(m)])",
    )
    assert probe.stdout.strip() == "[]", probe.stderr  # nothing of the extras came along
    owned = run(
        python,
        "-c",
        "import json; from importlib.metadata import files; "
        "print(json.dumps(sorted({f.parts[0] for f in files('refold') if f.parts[0] != '..'})))",
    )
    assert json.loads(owned.stdout) == ["refold", "refold-0.1.0.dist-info"]

    topic = make_topic(partitions=4, prefix="orders")
    published = run(python, "-c", _PUBLISH, kafka_bootstrap, topic)
    assert published.returncode == 0, published.stderr[-3000:]
    records = _records(kafka_bootstrap, topic, 4)
    assert len(records) == json.loads(published.stdout)["published"] > 0
    # A processor folds them (here its writer, in the test's own environment).
    projection = OrderStateProjection()
    FoldWriter(target, projection).apply(records, batch_id=0)
    codec = EventCodec()
    events = [(d.event_type, d.data) for d in map(codec.decode, (r.value for r in records))]
    read = run(python, "-c", _READ, redis_url, target.key_prefix)
    assert read.returncode == 0, read.stderr[-3000:]
    assert json.loads(read.stdout) == json.loads(
        json.dumps(fold_all(projection, events).states, sort_keys=True)
    )

    for command, extra in (("serve", "serve"), ("process", "spark"), ("demo", "local")):
        done = run(
            str(bin_dir / "refold"), command, *(["order_state"] if command == "process" else [])
        )
        assert done.returncode == 2, (command, done.stdout, done.stderr)
        assert f"pip install 'refold[{extra}]'" in done.stderr, (command, done.stderr)
        assert "Traceback" not in done.stderr
