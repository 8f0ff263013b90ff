"""Checkpoints on shared storage: a processor on HDFS (Hadoop's minicluster) is killed and resumes.

The processor's Spark checkpoints live at an ``hdfs://`` URL (``REFOLD_SPARK__CHECKPOINT_URL``),
and refold reads them there through Hadoop's own client: the query id (stats), and with Spark's
``kafka`` source each batch's ranges from the offsets log. A ``kill -9`` mid-stream, then a
restart from the checkpoint in HDFS: the state equals the oracle, nothing lost or applied
twice.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

from refold.contracts.layout import StateLayout
from refold.contracts.settings import SparkSettings
from refold.contracts.store.stats import ProcessorStats
from refold.deploy.simulators.orders import OrderSimulator
from refold.processors.runtime.checkpoints import (
    checkpoint_location,
    checkpoint_root,
    has_batches,
)
from tests.support.mini_hdfs import mini_hdfs

from .conftest import oracle


@pytest.fixture(scope="module")
def hdfs(tmp_path_factory):
    with mini_hdfs(tmp_path_factory.mktemp("hdfs")) as url:
        yield url


def test_a_processor_killed_on_hdfs_checkpoints_resumes_from_them_exactly(world, hdfs):
    root = f"{hdfs}/refold/checkpoints"
    options = world.launcher.options["order_state"].model_copy(update={"source_format": "kafka"})
    world.launcher = dataclasses.replace(
        world.launcher,
        spark=SparkSettings(checkpoint_url=root),
        options={"order_state": options},
    )
    events = list(OrderSimulator(2500, seed=43))
    half = len(events) // 2
    world.publisher().emit_many(events[:half])
    reader = world.reader()
    world.kill_after(world.processor(name="first").start(), half // 2)  # SIGKILL, mid-stream
    live = reader.registry.live()
    assert live is not None
    # The deployment's own folder below the URL (its key prefix is not the default).
    prefixed = checkpoint_root(
        world.state_dir, SparkSettings(checkpoint_url=root), key_prefix=world.redis.key_prefix
    )
    assert prefixed.startswith(f"{root}/")
    checkpoint = checkpoint_location(prefixed, "order_state", live)
    assert has_batches(checkpoint)  # read through Hadoop's client, in HDFS
    assert not (world.state_dir / "checkpoints").exists()

    world.publisher().emit_many(events[half:])
    world.run_to_log_end("second")
    log = (world.state_dir / "logs" / "second.log").read_text()
    assert f"resuming from checkpoint {checkpoint}" in log
    expected = oracle(events)
    assert world.state() == (expected.states, dict(expected.aggregate))
    assert reader.registry.live() == live
    stats = ProcessorStats(world.client, StateLayout("order_state", world.redis.key_prefix))
    assert stats.read(live).checkpoint_id  # the query id, from the checkpoint in HDFS

    # What `replay gc` does with a collected generation's checkpoints, in a process without a
    # Spark application (as `replay gc` is): through a JVM of its own.
    gc = (
        "import sys; from refold.processors.runtime.checkpoints import"
        " remove_generation_checkpoints;"
        " print(remove_generation_checkpoints(sys.argv[1], 'order_state', int(sys.argv[2])))"
    )
    done = subprocess.run(
        [sys.executable, "-c", gc, prefixed, str(live)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.stdout.strip() == "1", done.stderr
    assert not has_batches(checkpoint)
