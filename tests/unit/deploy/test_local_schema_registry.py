"""The local schema registry's pure parts: its pom, finding a Java 21+, unpacking the app."""

from __future__ import annotations

import io
import tarfile
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from refold.deploy.schema_registry import (
    JARS_ENV,
    JAVA_HOME_ENV,
    LocalSchemaRegistry,
    SchemaRegistryError,
    app_dir,
    registry_java,
)

ROOT = Path(__file__).resolve().parents[3]
POM = "{http://maven.apache.org/POM/4.0.0}"


def test_the_pom_fetches_apicurio_s_tar_gz_in_the_one_mvn_call():
    pom = ET.parse(ROOT / "deploy/jars/schema-registry/pom.xml").getroot()  # noqa: S314
    (dependency,) = pom.iter(f"{POM}dependency")
    assert dependency.findtext(f"{POM}groupId") == "io.apicurio"
    assert dependency.findtext(f"{POM}artifactId") == "apicurio-registry-app"
    assert dependency.findtext(f"{POM}type") == "tar.gz"
    assert dependency.findtext(f"{POM}classifier") == "all"
    parent = ET.parse(ROOT / "deploy/jars/pom.xml").getroot()  # noqa: S314
    assert "schema-registry" in [m.text for m in parent.iter(f"{POM}module")]
    assert parent.findtext(f"{POM}properties/{POM}apicurio.version") == "3.3.3"


def _jdk(root: Path, name: str, version: str) -> Path:
    home = root / name
    (home / "bin").mkdir(parents=True)
    (home / "bin" / "java").write_text("#!/bin/sh\n")
    (home / "release").write_text(f'IMPLEMENTOR="x"\nJAVA_VERSION="{version}"\n')
    return home


def test_the_newest_jdk_21_or_later_is_found_when_nothing_names_one(tmp_path):
    _jdk(tmp_path, "java-17-openjdk-amd64", "17.0.15")
    _jdk(tmp_path, "jdk-21", "21.0.2")
    newest = _jdk(tmp_path, "temurin-25-jdk-amd64", "25.0.3")
    assert registry_java({"PATH": ""}, tmp_path) == str(newest / "bin" / "java")


def test_the_setting_then_java_home_come_first_if_they_are_21_or_later(tmp_path):
    old = _jdk(tmp_path / "elsewhere", "jdk17", "17.0.1")
    mine = _jdk(tmp_path / "elsewhere", "jdk21", "21.0.1")
    _jdk(tmp_path / "jvm", "temurin-25", "25.0.3")
    env = {"PATH": "", JAVA_HOME_ENV: str(mine), "JAVA_HOME": str(old)}
    assert registry_java(env, tmp_path / "jvm") == str(mine / "bin" / "java")
    env = {"PATH": "", "JAVA_HOME": str(mine)}
    assert registry_java(env, tmp_path / "jvm") == str(mine / "bin" / "java")


def test_no_java_21_is_an_error_naming_what_was_found_and_what_to_do(tmp_path):
    old = _jdk(tmp_path, "java-17-openjdk-amd64", "17.0.15")
    with pytest.raises(SchemaRegistryError) as caught:
        registry_java({"PATH": "", "JAVA_HOME": str(old)}, tmp_path)
    message = str(caught.value)
    assert "needs Java 21 or later" in message
    assert f"{old} (JAVA_HOME): Java 17" in message
    assert JAVA_HOME_ENV in message
    with pytest.raises(SchemaRegistryError, match=f"{JAVA_HOME_ENV}=/nowhere is not a Java 21"):
        registry_java({"PATH": "", JAVA_HOME_ENV: "/nowhere"}, tmp_path)


def test_the_app_is_unpacked_once_from_its_tar_gz(tmp_path, monkeypatch):
    monkeypatch.delenv(JARS_ENV, raising=False)
    with pytest.raises(SchemaRegistryError, match="run `make setup`"):
        app_dir(tmp_path)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        data = b"jar"
        info = tarfile.TarInfo("quarkus-run.jar")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    (tmp_path / "apicurio-registry-app-3.3.3-all.tar.gz").write_bytes(buffer.getvalue())
    app = app_dir(tmp_path)
    assert app == tmp_path / "apicurio-registry-app-3.3.3"
    assert (app / "quarkus-run.jar").read_bytes() == b"jar"
    (app / "quarkus-run.jar").write_bytes(b"kept")
    assert app_dir(tmp_path) == app  # not unpacked again
    assert (app / "quarkus-run.jar").read_bytes() == b"kept"


def test_the_registry_stores_its_schemas_in_an_h2_file_under_the_state_dir(tmp_path):
    registry = LocalSchemaRegistry(tmp_path / "stack", 18099)
    assert registry.data_dir == tmp_path / "stack" / "schema-registry"
    assert registry.database_url == f"jdbc:h2:file:{tmp_path}/stack/schema-registry/registry"


def test_kafka_connect_s_jars_are_a_module_of_the_one_mvn_call():
    pom = ET.parse(ROOT / "deploy/jars/kafka-connect/pom.xml").getroot()  # noqa: S314
    artifacts = {d.findtext(f"{POM}artifactId") for d in pom.iter(f"{POM}dependency")}
    assert {"connect-runtime", "connect-file", "apicurio-registry-utils-converter"} <= artifacts
    parent = ET.parse(ROOT / "deploy/jars/pom.xml").getroot()  # noqa: S314
    assert "kafka-connect" in [m.text for m in parent.iter(f"{POM}module")]
