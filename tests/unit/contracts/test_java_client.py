"""librdkafka settings translated for Spark's JVM Kafka source (pure)."""

import pytest

from refold.contracts.kafka.java_client import JavaClientConfigError, java_client_properties
from refold.contracts.settings import KafkaSettings


def test_plain_settings_pass_through_unchanged():
    settings = KafkaSettings(
        bootstrap_servers="b1:9092,b2:9092", client_properties={"client.id": "x"}
    )
    assert settings.as_java_client() == {"bootstrap.servers": "b1:9092,b2:9092", "client.id": "x"}


def test_scram_over_tls_becomes_a_jaas_line_and_a_pem_trust_store():
    settings = KafkaSettings(
        client_properties={
            "security.protocol": "SASL_SSL",
            "sasl.mechanisms": "SCRAM-SHA-512",
            "sasl.username": "refold",
            "ssl.ca.location": "/etc/refold/ca.pem",
        },
        secret_properties={"sasl.password": 'p"w\\d'},
    )
    java = settings.as_java_client()
    assert java == {
        "bootstrap.servers": "127.0.0.1:19092",
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.jaas.config": "org.apache.kafka.common.security.scram.ScramLoginModule required "
        'username="refold" password="p\\"w\\\\d";',
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": "/etc/refold/ca.pem",
    }


def test_plain_sasl_and_a_client_certificate_are_inlined(tmp_path):
    (tmp_path / "c.pem").write_text("CERT")
    (tmp_path / "k.pem").write_text("KEY")
    java = java_client_properties(
        {
            "sasl.mechanism": "PLAIN",
            "sasl.username": "u",
            "sasl.password": "p",
            "ssl.certificate.location": str(tmp_path / "c.pem"),
            "ssl.key.location": str(tmp_path / "k.pem"),
            "ssl.endpoint.identification.algorithm": "none",
        }
    )
    assert java["sasl.jaas.config"].startswith("org.apache.kafka.common.security.plain.")
    assert (java["ssl.keystore.type"], java["ssl.keystore.certificate.chain"]) == ("PEM", "CERT")
    assert java["ssl.keystore.key"] == "KEY"
    assert java["ssl.endpoint.identification.algorithm"] == ""


def test_a_given_jaas_line_wins_and_what_cannot_be_built_is_refused():
    given = {"sasl.mechanism": "OAUTHBEARER", "sasl.jaas.config": "mine;", "sasl.username": "u"}
    assert java_client_properties(given)["sasl.jaas.config"] == "mine;"
    with pytest.raises(JavaClientConfigError, match=r"sasl\.jaas\.config"):
        java_client_properties({"sasl.mechanism": "GSSAPI", "sasl.username": "u"})
    with pytest.raises(JavaClientConfigError, match="go together"):
        java_client_properties({"ssl.certificate.location": "/c.pem"})
