"""The secured stack's settings: listeners, client properties, and where the secrets go (pure)."""

from __future__ import annotations

import json
from pathlib import Path

from confluent_kafka import KafkaError

from refold.contracts.kafka.credentials import AuthWatch, KafkaCredentialsError, refused
from refold.deploy.stack_security import SCRAM_MECHANISM, StackSecurity

CREDENTIALS = {
    "user": "refold",
    "kafka_password": "kafka-secret-1",
    "redis_password": "redis-secret-2",
    "store_password": "store-secret-3",
}


def _security(tmp_path: Path) -> StackSecurity:
    security = StackSecurity(tmp_path / "secrets", "/usr/bin/java")
    security.folder.mkdir()
    security.credentials_file.write_text(json.dumps(CREDENTIALS))
    return security


def test_the_broker_listens_with_sasl_ssl_and_scram_and_its_controller_stays_local(tmp_path):
    text = _security(tmp_path).broker_properties(19092, 19093)
    lines = dict(line.split("=", 1) for line in text.splitlines())
    assert lines["listeners"] == "SASL_SSL://127.0.0.1:19092,CONTROLLER://127.0.0.1:19093"
    assert lines["sasl.enabled.mechanisms"] == SCRAM_MECHANISM
    assert lines["listener.security.protocol.map"] == "SASL_SSL:SASL_SSL,CONTROLLER:PLAINTEXT"
    assert 'username="refold" password="kafka-secret-1"' in text  # the broker's own login
    assert lines["ssl.keystore.type"] == "PKCS12"


def test_clients_get_the_password_as_a_secret_and_the_ca_to_trust(tmp_path):
    security = _security(tmp_path)
    kafka = security.kafka_settings("127.0.0.1:19092")
    assert kafka.client_properties == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanisms": SCRAM_MECHANISM,
        "sasl.username": "refold",
        "ssl.ca.location": str(security.ca_file),
    }
    assert "kafka-secret-1" not in repr(kafka)
    assert kafka.as_librdkafka()["sasl.password"] == "kafka-secret-1"
    redis = security.redis_settings("redis://127.0.0.1:16379/0", "p")
    assert (redis.username, "redis-secret-2" in repr(redis)) == ("refold", False)
    assert security.redis_arguments() == ["--aclfile", str(security.acl_file)]
    assert security.format_arguments() == [
        "--add-scram",
        f"{SCRAM_MECHANISM}=[name=refold,password=kafka-secret-1]",
    ]


def test_a_refused_login_names_the_client_and_the_user_never_the_password():
    watch = AuthWatch()
    watch(KafkaError(KafkaError._TRANSPORT, "down"))
    assert watch.failure is None
    watch(KafkaError(KafkaError._AUTHENTICATION, "invalid credentials"))
    assert watch.failure == "invalid credentials"
    config = {
        "bootstrap.servers": "127.0.0.1:19092",
        "sasl.username": "refold",
        "sasl.mechanisms": SCRAM_MECHANISM,
        "sasl.password": "kafka-secret-1",
    }
    error = refused("the producer", config, watch.failure)
    assert isinstance(error, KafkaCredentialsError)
    assert error.code == "KAFKA_CREDENTIALS_REFUSED"
    text = str(error)
    assert "the producer" in text
    assert "user 'refold'" in text
    assert "127.0.0.1:19092" in text
    assert "kafka-secret-1" not in text
