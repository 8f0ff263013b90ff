"""A processor on the local Spark standalone cluster (``refold cluster up``) equals its oracle."""

from __future__ import annotations

import dataclasses

from refold.contracts.process_group import GroupProcess
from refold.contracts.processors import ProcessLauncher
from refold.contracts.settings import SparkSettings
from refold.deploy.cluster import ClusterSpec, SparkCluster
from refold.deploy.local_stack import free_port
from refold.deploy.simulators.orders import OrderSimulator

from .conftest import oracle


def test_order_state_on_a_standalone_cluster_equals_the_oracle(world, tmp_path):
    events = list(OrderSimulator(300, seed=51))
    world.publisher().emit_many(events)
    spec = ClusterSpec(
        master_port=free_port(),
        webui_port=free_port(),
        worker_webui_port=free_port(),
        worker_cores=2,
        worker_memory="1g",
    )
    cluster = SparkCluster(tmp_path / "cluster", spec)
    cluster.start()
    try:
        # One core for the application, so that others could share the cluster.
        on_cluster = SparkSettings(master=spec.master_url, cores_max=1, executor_memory="512m")
        launcher: ProcessLauncher = dataclasses.replace(world.launcher, spark=on_cluster)
        process = GroupProcess(
            launcher.argv(["order_state"], available_now=True),
            launcher.env(),
            tmp_path / "logs" / "on-cluster.log",
        ).start()
        assert process.wait(timeout=300) == 0, process.log_tail()
        master = cluster.master_state()
        assert master is not None
        applications = master["completedapps"] + master["activeapps"]
        assert [a["name"] for a in applications] == ["refold-order_state"], applications
    finally:
        cluster.stop()
    states, totals = world.state()
    expected = oracle(events)
    assert states == expected.states
    assert totals == dict(expected.aggregate)
