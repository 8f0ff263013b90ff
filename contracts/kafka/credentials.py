"""Kafka refusing a client's credentials, or not answering: errors that say where and what to do.

A refused login names the client, never the password; a broker that does not answer is named
by its address, with how to start it (:func:`not_answering`).

librdkafka reports a refused SASL login as a client error (``_AUTHENTICATION``) and keeps
retrying, so a call then times out with a transport error that does not say why. An
:class:`AuthWatch` given as a client's ``error_cb`` remembers the refusal, and the client's
owner raises :func:`refused` instead.
"""

from __future__ import annotations

from collections.abc import Mapping

from confluent_kafka import KafkaError, KafkaException

from refold.contracts.errors import RefoldError

__all__ = ["AuthWatch", "KafkaCredentialsError", "is_refusal", "not_answering", "refused"]

# No broker answered: librdkafka's local errors for it (a refused login is told apart first).
_NO_BROKER = frozenset(
    {
        KafkaError._TRANSPORT,  # noqa: SLF001 - librdkafka's public error names start with _
        KafkaError._ALL_BROKERS_DOWN,  # noqa: SLF001
        KafkaError._RESOLVE,  # noqa: SLF001
        KafkaError._TIMED_OUT,  # noqa: SLF001
    }
)


class KafkaCredentialsError(RefoldError):
    """The broker refused a client's SASL credentials (or its TLS handshake)."""

    code = "KAFKA_CREDENTIALS_REFUSED"
    retriable = False


def is_refusal(error: KafkaError) -> bool:
    """Whether ``error`` is the broker refusing the client's login."""
    return bool(error.code() == KafkaError._AUTHENTICATION)  # noqa: SLF001 - librdkafka's public name


class AuthWatch:
    """An ``error_cb`` that remembers the first refused login (``failure``) and passes on."""

    def __init__(self) -> None:
        self.failure: str | None = None

    def __call__(self, error: KafkaError) -> None:
        """Librdkafka's error callback: note a refused login; others are librdkafka's."""
        if self.failure is None and is_refusal(error):
            self.failure = error.str()


def refused(client: str, config: Mapping[str, object], reason: str) -> KafkaCredentialsError:
    """The error for ``client`` (e.g. "the producer") whose login Kafka refused.

    Names the broker, the user and the mechanism; the password stays out.
    """
    user = config.get("sasl.username", "(none)")
    mechanism = config.get("sasl.mechanisms", config.get("sasl.mechanism", "(none)"))
    return KafkaCredentialsError(
        f"Kafka at {config.get('bootstrap.servers')} refused the credentials of {client} "
        f"(user {user!r}, {mechanism}): {reason}. Operator action: check sasl.username "
        "(REFOLD_KAFKA__CLIENT_PROPERTIES) and sasl.password (REFOLD_KAFKA__SECRET_PROPERTIES)."
    )


def not_answering(config: Mapping[str, object], exc: KafkaException) -> str | None:
    """What to say when no broker of ``config`` answered the call that raised ``exc``.

    None when ``exc`` is another error (the broker answered, and refused or failed).
    """
    error = exc.args[0] if exc.args else None
    if not isinstance(error, KafkaError) or error.code() not in _NO_BROKER:
        return None
    return (
        f"cannot reach Kafka at {config.get('bootstrap.servers')} ({error.str()}). Operator "
        "action: start the broker (`refold up` starts the local stack) or set "
        "REFOLD_KAFKA__BOOTSTRAP_SERVERS to where it runs."
    )
