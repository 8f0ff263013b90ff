"""librdkafka client properties translated for Java Kafka clients (Spark's ``kafka`` source).

refold's settings speak librdkafka, the client of every Python process. Spark's JVM connector
takes Java client properties (as ``kafka.<name>`` options), and the two differ where security
is concerned: SASL credentials are a JAAS line in Java, and certificates are files of PEM
stores. Anything else passes through with its name, as most names are shared; a property the
Java client does not know is logged and ignored by it, which never weakens a setting refold
made (verification stays on in Java where librdkafka was told to skip it, for instance).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

__all__ = ["JavaClientConfigError", "java_client_properties"]

# librdkafka's SASL mechanisms and the Java login module that speaks each.
_LOGIN_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}
# Consumed by the translation; they are not passed through as they are.
_TRANSLATED = frozenset(
    {
        "sasl.mechanisms",
        "sasl.mechanism",
        "sasl.username",
        "sasl.password",
        "ssl.ca.location",
        "ssl.certificate.location",
        "ssl.key.location",
        "ssl.endpoint.identification.algorithm",
    }
)


class JavaClientConfigError(ValueError):
    """The librdkafka properties have no Java equivalent refold can build (says which)."""


def _quoted(value: str) -> str:
    """A JAAS option value: double-quoted, with backslashes and quotes escaped."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def java_client_properties(librdkafka: Mapping[str, str]) -> dict[str, str]:
    """The Java client properties equivalent to ``librdkafka``'s.

    Args:
        librdkafka: What :meth:`refold.contracts.settings.KafkaSettings.as_librdkafka` returns.

    Returns:
        Java client properties (without Spark's ``kafka.`` prefix).

    Raises:
        JavaClientConfigError: A SASL mechanism Java cannot be given a login for here
            (``GSSAPI``, ``OAUTHBEARER``: configure ``sasl.jaas.config`` yourself), a username
            without a password, or a certificate without its key.
    """
    java = {k: v for k, v in librdkafka.items() if k not in _TRANSLATED}
    mechanism = librdkafka.get("sasl.mechanism") or librdkafka.get("sasl.mechanisms")
    if mechanism:
        java["sasl.mechanism"] = mechanism
    username, password = librdkafka.get("sasl.username"), librdkafka.get("sasl.password")
    if (username or password) and "sasl.jaas.config" not in java:
        module = _LOGIN_MODULES.get(mechanism or "PLAIN")
        if module is None or username is None or password is None:
            msg = (
                f"Spark's kafka source cannot log in with SASL mechanism {mechanism!r} from "
                "sasl.username/sasl.password. Operator action: give the Java client's "
                "sasl.jaas.config in REFOLD_KAFKA__SECRET_PROPERTIES."
            )
            raise JavaClientConfigError(msg)
        java["sasl.jaas.config"] = (
            f"{module} required username={_quoted(username)} password={_quoted(password)};"
        )
    if "ssl.ca.location" in librdkafka:
        java["ssl.truststore.type"] = "PEM"
        java["ssl.truststore.location"] = librdkafka["ssl.ca.location"]
    certificate = librdkafka.get("ssl.certificate.location")
    key = librdkafka.get("ssl.key.location")
    if certificate or key:
        if not (certificate and key):
            msg = "ssl.certificate.location and ssl.key.location go together (mutual TLS)"
            raise JavaClientConfigError(msg)
        # Java reads a PEM key store from one file holding both, or from the two inline.
        java["ssl.keystore.type"] = "PEM"
        java["ssl.keystore.certificate.chain"] = Path(certificate).read_text()
        java["ssl.keystore.key"] = Path(key).read_text()
    verify = librdkafka.get("ssl.endpoint.identification.algorithm")
    if verify is not None:
        java["ssl.endpoint.identification.algorithm"] = "" if verify == "none" else verify
    return java
