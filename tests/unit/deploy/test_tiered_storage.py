"""The tiered local broker's settings, its plugin's jar, and a state dir that stays tiered."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from refold.deploy.kafka_broker import KAFKA_JARS_ENV, BrokerError
from refold.deploy.local_stack import LocalStack
from refold.deploy.tiered_storage import LOCAL_TIERED_STORAGE, TieredStorage

ROOT = Path(__file__).resolve().parents[3]
POM = "{http://maven.apache.org/POM/4.0.0}"


def test_the_pom_fetches_the_test_fixtures_jar_alone_into_its_own_folder():
    pom = ET.parse(ROOT / "deploy/jars/kafka-tiered-storage/pom.xml").getroot()  # noqa: S314
    (dependency,) = pom.iter(f"{POM}dependency")
    assert dependency.findtext(f"{POM}artifactId") == "kafka-storage"
    assert dependency.findtext(f"{POM}version") == "${kafka.version}"
    assert dependency.findtext(f"{POM}classifier") == "test-fixtures"
    # No transitive jar: what it uses is the broker's own (.jars/kafka).
    assert dependency.findtext(f"{POM}exclusions/{POM}exclusion/{POM}artifactId") == "*"
    modules = ET.parse(ROOT / "deploy/jars/pom.xml").getroot()  # noqa: S314
    assert "kafka-tiered-storage" in [m.text for m in modules.iter(f"{POM}module")]


@pytest.fixture
def jars(tmp_path, monkeypatch):
    kafka = tmp_path / "jars" / "kafka"
    kafka.mkdir(parents=True)
    (kafka / "kafka_2.13-4.4.0.jar").touch()
    monkeypatch.setenv(KAFKA_JARS_ENV, str(kafka))
    return tmp_path / "jars"


def test_the_broker_properties_name_the_plugin_its_jar_and_its_folder(jars, tmp_path):
    plugin = jars / "kafka-tiered-storage" / "kafka-storage-4.4.0-test-fixtures.jar"
    plugin.parent.mkdir()
    plugin.touch()
    tier = TieredStorage(tmp_path / "remote")
    lines = dict(line.split("=", 1) for line in tier.broker_properties("PLAINTEXT").splitlines())
    assert lines["remote.log.storage.system.enable"] == "true"
    assert lines["remote.log.storage.manager.class.name"] == LOCAL_TIERED_STORAGE
    assert lines["remote.log.storage.manager.class.path"] == str(plugin)
    assert lines["rsm.config.dir"] == str(tier.root)
    assert lines["remote.log.metadata.manager.listener.name"] == "PLAINTEXT"
    assert lines["rlmm.config.remote.log.metadata.topic.replication.factor"] == "1"
    assert tier.root.is_dir()


def test_a_missing_plugin_jar_says_what_to_run(jars, tmp_path):
    with pytest.raises(BrokerError, match=r"make setup.*kafka-storage:4\.4\.0:test-fixtures"):
        TieredStorage(tmp_path / "remote").broker_properties("PLAINTEXT")


def test_a_state_dir_started_tiered_stays_tiered(tmp_path):
    assert LocalStack(tmp_path).tiered is None
    assert LocalStack(tmp_path, tiered_storage=True).tiered is not None
    (tmp_path / "kafka" / "remote").mkdir(parents=True)  # what the first tiered start made
    assert LocalStack(tmp_path).tiered == TieredStorage(tmp_path / "kafka" / "remote")
