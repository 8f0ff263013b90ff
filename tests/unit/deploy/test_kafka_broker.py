"""The JVM parts' files: pinned versions agree, the broker's configuration is one KRaft node."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pyspark
import pytest

from refold.contracts.settings import SparkSettings
from refold.deploy.kafka_broker import BrokerError, KafkaBroker, jars_dir, kafka_version
from refold.processors.runtime.spark import connector_jars, kafka_connector_version

ROOT = Path(__file__).resolve().parents[3]
POM = "{http://maven.apache.org/POM/4.0.0}"


def _pom_property(name: str) -> str:
    pom = ET.parse(ROOT / "deploy/jars/pom.xml")  # noqa: S314 - our own file
    found = pom.getroot().find(f"{POM}properties/{POM}{name}")
    assert found is not None
    assert found.text
    return found.text


def test_compose_runs_the_kafka_version_the_pom_pins():
    compose = (ROOT / "deploy/compose.yaml").read_text()
    (image,) = re.findall(r"image: apache/kafka:(\S+)", compose)
    assert image == _pom_property("kafka.version")


def test_the_jars_make_setup_fetched_are_the_pinned_version():
    assert kafka_version(jars_dir()) == _pom_property("kafka.version")


def test_spark_s_kafka_connector_is_the_installed_pyspark_s_version():
    pinned = re.search(r'"pyspark==([^"]+)"', (ROOT / "pyproject.toml").read_text())
    assert pinned is not None
    assert pinned.group(1) == pyspark.__version__
    fetched = kafka_connector_version(connector_jars(SparkSettings()))
    assert fetched == pyspark.__version__


def test_the_configuration_is_one_kraft_node_without_auto_creation(tmp_path):
    broker = KafkaBroker(tmp_path / "kafka", 29092, 29093)
    broker.data_dir.mkdir(parents=True)
    (broker.data_dir / "stray").write_text("x")  # refused before formatting: nothing runs
    with pytest.raises(BrokerError, match="not empty but was never formatted"):
        broker.prepare()
    properties = dict(
        line.split("=", 1) for line in broker.config_file.read_text().splitlines() if line
    )
    assert properties["process.roles"] == "broker,controller"
    assert properties["listeners"] == "PLAINTEXT://127.0.0.1:29092,CONTROLLER://127.0.0.1:29093"
    assert properties["controller.quorum.voters"] == "1@127.0.0.1:29093"
    assert properties["auto.create.topics.enable"] == "false"
    assert properties["log.dirs"] == str(broker.data_dir)
    assert broker.command()[-2:] == ["kafka.Kafka", str(broker.config_file)]


def test_the_jars_folder_can_be_elsewhere_and_its_absence_says_what_to_run(tmp_path, monkeypatch):
    monkeypatch.setenv("REFOLD_KAFKA_JARS", str(tmp_path))
    with pytest.raises(BrokerError, match=r"not in .*`make setup`.*REFOLD_KAFKA_JARS"):
        jars_dir()
    (tmp_path / "kafka_2.13-9.9.9.jar").write_bytes(b"")
    assert jars_dir() == tmp_path
    assert kafka_version(tmp_path) == "9.9.9"
