"""A local Kafka cluster's files and rules, without starting it: each node's configuration,
the format's initial controllers, the ports, a state dir that keeps its kind."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from refold.deploy.cli import build_parser
from refold.deploy.kafka_broker import BrokerError
from refold.deploy.kafka_cluster import (
    KafkaClusterError,
    LocalKafkaCluster,
    UnderReplicated,
    recorded_nodes,
)
from refold.deploy.local_stack import LocalStack, LocalStackError


def _properties(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if line)


def test_each_node_is_a_broker_and_controller_of_one_quorum_with_three_replicas(tmp_path):
    cluster = LocalKafkaCluster(tmp_path, 29100)
    assert cluster.node_ids == [1, 2, 3]
    assert cluster.bootstrap_servers == "127.0.0.1:29100,127.0.0.1:29101,127.0.0.1:29102"
    node = cluster.broker(2)
    node.home.mkdir(parents=True)
    node.data_dir.mkdir()
    (node.data_dir / "stray").write_text("x")  # refused before formatting: nothing runs
    with pytest.raises(BrokerError, match="not empty but was never formatted"):
        node.prepare()
    properties = _properties(node.config_file.read_text())
    assert properties["node.id"] == "2"
    assert properties["process.roles"] == "broker,controller"
    assert properties["listeners"] == "PLAINTEXT://127.0.0.1:29101,CONTROLLER://127.0.0.1:29104"
    assert properties["controller.quorum.bootstrap.servers"] == (
        "127.0.0.1:29103,127.0.0.1:29104,127.0.0.1:29105"
    )
    assert "controller.quorum.voters" not in properties  # a dynamic quorum: voters in the log
    for key in (
        "default.replication.factor",
        "offsets.topic.replication.factor",
        "transaction.state.log.replication.factor",
        "share.coordinator.state.topic.replication.factor",
    ):
        assert properties[key] == "3", key
    for key in (
        "min.insync.replicas",
        "transaction.state.log.min.isr",
        "share.coordinator.state.topic.min.isr",
    ):
        assert properties[key] == "2", key
    assert properties["log.dirs"] == str(tmp_path / "kafka-cluster" / "node-2" / "data")
    cluster_id, voters = cluster.quorum.format_arguments()
    assert cluster_id == f"--cluster-id={cluster.quorum.cluster_id}"
    dirs = [c.directory_id for c in cluster.quorum.controllers]
    assert voters == (
        f"--initial-controllers=1@127.0.0.1:29103:{dirs[0]},2@127.0.0.1:29104:{dirs[1]},"
        f"3@127.0.0.1:29105:{dirs[2]}"
    )
    assert len(set(dirs)) == 3
    assert all(len(d) == 22 for d in [*dirs, cluster.quorum.cluster_id])


def test_a_formed_cluster_keeps_its_ids_and_ports(tmp_path):
    first = LocalKafkaCluster(tmp_path, 29100)
    first.home.mkdir(parents=True)
    first._record()
    assert recorded_nodes(tmp_path) == 3
    again = LocalKafkaCluster(tmp_path, 40000)
    assert again.formed
    assert again.quorum == first.quorum
    assert again.ports == (29100, 29101, 29102)
    recorded = json.loads((first.home / "cluster.json").read_text())
    assert [n["node_id"] for n in recorded["nodes"]] == [1, 2, 3]


def test_fewer_than_three_nodes_is_refused():
    with pytest.raises(KafkaClusterError, match="survives no node's loss"):
        LocalKafkaCluster(Path("/nonexistent"), 29100, nodes=2)


def test_a_state_dir_keeps_its_kind_of_kafka(tmp_path):
    single = tmp_path / "single"
    (single / "kafka" / "data").mkdir(parents=True)
    (single / "kafka" / "data" / "meta.properties").write_text("cluster.id=x\n")
    with pytest.raises(LocalStackError, match="holds a single broker's log, not --kafka-nodes 3"):
        LocalStack(single, 29100, 29200, kafka_nodes=3)
    assert LocalStack(single, 29100, 29200).kafka_cluster is None
    clustered = tmp_path / "clustered"
    LocalKafkaCluster(clustered, 29100).home.mkdir(parents=True)
    LocalKafkaCluster(clustered, 29100)._record()
    with pytest.raises(LocalStackError, match="holds a 3-node Kafka cluster's log"):
        LocalStack(clustered, 29100, 29200, kafka_nodes=1)
    stack = LocalStack(clustered, 12345, 29200)  # as first started, on its recorded ports
    assert stack.kafka_cluster is not None
    assert stack.bootstrap_servers == "127.0.0.1:29100,127.0.0.1:29101,127.0.0.1:29102"
    assert LocalStack(tmp_path / "new", 29100, 29200).kafka_cluster is None  # the default


def test_a_cluster_with_secure_or_tiered_storage_is_refused_for_now(tmp_path):
    with pytest.raises(LocalStackError, match="--secure or --tiered-storage is not supported"):
        LocalStack(tmp_path, 29100, 29200, kafka_nodes=3, tiered_storage=True)


def test_refold_up_takes_one_or_three_kafka_nodes(capsys):
    args = build_parser().parse_args(["up", "--kafka-nodes", "3"])
    assert args.kafka_nodes == 3
    assert build_parser().parse_args(["up"]).kafka_nodes is None
    with pytest.raises(SystemExit):
        build_parser().parse_args(["up", "--kafka-nodes", "2"])
    assert "invalid choice" in capsys.readouterr().err


def test_an_under_replicated_partition_names_its_leader_and_in_sync_replicas():
    lagging = UnderReplicated("orders", 3, 1, (1, 2, 3), (1, 3))
    assert str(lagging) == "orders/3 (leader 1, in sync 1,3 of 3)"
    offline = UnderReplicated("orders", 4, -1, (2,), ())
    assert str(offline) == "orders/4 (no leader, in sync none of 1)"
