"""Registry framing's schemas: a schema registry reached through confluent-kafka's own client.

Registry framing (the Confluent wire format) is byte ``0x00``, the writer schema's id as 4 bytes
big-endian, then the Avro body. The id is the registry's; refold maps it to the locked version
with the same fingerprint (the lock stays the source of truth: a schema behind an id that is no
locked version is refused, as an unknown fingerprint is). docs/schema-registry.md.

Subjects follow **RecordNameStrategy** (the subject is the record's full name, e.g.
``refold.commerce.OrderPlaced``): a refold topic carries several event types, so the
one-schema-per-topic default (TopicNameStrategy) cannot hold them, and a record's versions are
one history whatever topic carries it, exactly as ``contracts.lock`` keeps them
(TopicRecordNameStrategy would copy that history per topic, with nothing to keep the copies
alike).

The client is :class:`confluent_kafka.schema_registry.SchemaRegistryClient` (basic auth and
TLS are its own settings, passed through from :class:`SchemaRegistrySettings`). Nothing here
talks to a registry until a registry-framed record is decoded or encoded.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import TYPE_CHECKING, Any, Literal

from fastavro.schema import fingerprint, to_parsing_canonical_form
from pydantic import BaseModel, ConfigDict, Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from refold.contracts.errors import ContractError, DeserializationError

if TYPE_CHECKING:
    from confluent_kafka.schema_registry import SchemaRegistryClient

    from refold.contracts.catalog import SchemaVersion

__all__ = [
    "REGISTRY",
    "SINGLE_OBJECT",
    "Framing",
    "RegistrySchemas",
    "SchemaNotRegisteredError",
    "SchemaRegistrySettings",
    "SchemaRegistryUnavailableError",
    "schema_text",
    "subject_of",
]

logger = logging.getLogger(__name__)

Framing = Literal["single-object", "registry"]
SINGLE_OBJECT: Framing = "single-object"
REGISTRY: Framing = "registry"
# Subject or version not found, schema not found (the registry's error codes).
_NOT_FOUND = {40401, 40402, 40403}
_RETRY_PAUSE_S = (0.2, 0.5, 1.0, 2.0, 5.0)


class SchemaNotRegisteredError(ContractError):
    """A schema version is not in the schema registry: nothing was sent."""

    code = "SCHEMA_NOT_REGISTERED"


class SchemaRegistryUnavailableError(ContractError):
    """The schema registry did not answer within the wait allowed (``outage_wait_s``).

    Never a dead letter: the record is not skipped, the work that needed it stops (a processor's
    batch fails and runs again).
    """

    code = "SCHEMA_REGISTRY_UNAVAILABLE"
    retriable = True


class SchemaRegistrySettings(BaseModel):
    """Where the schema registry is (``REFOLD_SCHEMA_REGISTRY__*``).

    Attributes:
        url: Its Confluent-compatible API, e.g. ``http://127.0.0.1:18081/apis/ccompat/v7`` for
            Apicurio (``refold up --schema-registry`` prints it). None: no registry; records in
            registry framing are then refused, naming this setting.
        basic_auth_user_info: ``user:password`` for HTTP basic auth (a secret).
        client_properties: More settings of confluent-kafka's ``SchemaRegistryClient``
            (``ssl.ca.location``, ``ssl.certificate.location``, ``timeout``, ...).
        secret_properties: Those that are secrets (``ssl.key.password``), never logged.
        outage_wait_s: How long a decode or an encode waits for a registry that does not
            answer (logging the start and the end of the outage) before it fails; a record is
            never skipped for it.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    url: str | None = None
    basic_auth_user_info: SecretStr | None = None
    client_properties: dict[str, str] = Field(default_factory=dict)
    secret_properties: dict[str, SecretStr] = Field(default_factory=dict)
    outage_wait_s: float = 300.0

    def client_config(self) -> dict[str, Any]:
        """The one translation point to ``SchemaRegistryClient``'s configuration.

        Raises:
            ContractError: No ``url`` is set.
        """
        if not self.url:
            msg = (
                "no schema registry is configured. Operator action: set "
                "REFOLD_SCHEMA_REGISTRY__URL (`refold up --schema-registry` starts one)."
            )
            raise ContractError(msg)
        config: dict[str, Any] = {"url": self.url, **self.client_properties}
        if self.basic_auth_user_info is not None:
            config["basic.auth.user.info"] = self.basic_auth_user_info.get_secret_value()
        config.update({k: v.get_secret_value() for k, v in self.secret_properties.items()})
        return config

    @classmethod
    def from_env(cls) -> SchemaRegistrySettings:
        """The settings of ``REFOLD_SCHEMA_REGISTRY__*`` (all unset: no registry)."""
        return _FromEnv().schema_registry


class _FromEnv(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="REFOLD_", env_nested_delimiter="__", frozen=True, extra="ignore"
    )

    schema_registry: SchemaRegistrySettings = Field(default_factory=SchemaRegistrySettings)


def subject_of(version: SchemaVersion) -> str:
    """The registry subject of a record's versions (RecordNameStrategy: its full name)."""
    return version.full_name


def schema_text(version: SchemaVersion) -> str:
    """The schema as registered and looked up (the file's JSON, compact: one text everywhere)."""
    return json.dumps(version.raw, separators=(",", ":"))


def fingerprint_of_text(text: str) -> bytes:
    """The CRC-64-AVRO fingerprint (little-endian, as in single-object headers) of a schema."""
    return bytes.fromhex(fingerprint(to_parsing_canonical_form(json.loads(text)), "CRC-64-AVRO"))


class RegistrySchemas:
    """Schema ids <-> fingerprints, through a schema registry, cached for the process.

    Picklable (the settings and the caches travel; the client is opened again, lazily, where
    the copy runs) and safe to share between threads.

    Args:
        settings: Where the registry is.
        client: An open client to use; default one opened from ``settings`` on first use.
    """

    def __init__(
        self, settings: SchemaRegistrySettings, client: SchemaRegistryClient | None = None
    ) -> None:
        self.settings = settings
        self._client = client
        self._lock = threading.Lock()
        self._fingerprints: dict[int, bytes] = {}  # schema id -> writer fingerprint
        self._ids: dict[bytes, int] = {}  # fingerprint -> schema id (encode)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_client"] = None
        state["_lock"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    @property
    def client(self) -> SchemaRegistryClient:
        """confluent-kafka's client (opened on first use)."""
        if self._client is None:
            with self._lock:
                if self._client is None:
                    from confluent_kafka.schema_registry import SchemaRegistryClient

                    # new_client: a mock:// URL is confluent-kafka's in-memory client (unit
                    # tests of pure logic only)
                    self._client = SchemaRegistryClient.new_client(self.settings.client_config())
        return self._client

    def fingerprint_of_id(self, schema_id: int) -> bytes:
        """The fingerprint of the schema behind ``schema_id`` (one registry call per id).

        Raises:
            DeserializationError: ``unknown-schema-id`` (the registry has no such id) or
                ``no-schema-registry`` (none configured).
            SchemaRegistryUnavailableError: It did not answer within ``outage_wait_s``.
        """
        found = self._fingerprints.get(schema_id)
        if found is not None:
            return found
        if not self.settings.url:
            reason = "no-schema-registry"
            detail = (
                f"registry-framed record (schema id {schema_id}) and no schema registry is "
                "configured (REFOLD_SCHEMA_REGISTRY__URL)"
            )
            raise DeserializationError(reason, detail)
        schema = self._call(f"schema id {schema_id}", lambda: self.client.get_schema(schema_id))
        if schema is None:
            reason = "unknown-schema-id"
            detail = f"the schema registry at {self.settings.url} has no schema id {schema_id}"
            raise DeserializationError(reason, detail)
        found = self._fingerprints[schema_id] = fingerprint_of_text(str(schema.schema_str))
        return found

    def id_of(self, version: SchemaVersion) -> int:
        """The registry's id of a locked version (looked up once per version).

        Raises:
            SchemaNotRegisteredError: Not registered, saying what to run.
            SchemaRegistryUnavailableError: It did not answer within ``outage_wait_s``.
        """
        found = self._ids.get(version.fingerprint)
        if found is not None:
            return found
        from confluent_kafka.schema_registry import Schema

        subject = subject_of(version)
        what = f"{version.name} v{version.version} under subject {subject}"
        text = schema_text(version)
        registered = self._call(
            what, lambda: self.client.lookup_schema(subject, Schema(text, "AVRO"))
        )
        if registered is None or registered.schema_id is None:
            msg = (
                f"{version.name} v{version.version} (fingerprint {version.fingerprint_hex}) is "
                f"not registered in the schema registry at {self.settings.url} (subject "
                f"{subject}); nothing was sent. Operator action: run `refold contracts "
                "publish` with REFOLD_SCHEMA_REGISTRY__URL set."
            )
            raise SchemaNotRegisteredError(msg)
        self._fingerprints[registered.schema_id] = version.fingerprint
        found = self._ids[version.fingerprint] = int(registered.schema_id)
        return found

    def _call(self, what: str, call: Any) -> Any:
        """``call()``; None when the registry says it has no such thing; waits out an outage."""
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        started = time.monotonic()
        failures = 0
        while True:
            try:
                answer = call()
            except SchemaRegistryError as exc:
                if exc.error_code in _NOT_FOUND or exc.http_status_code == 404:
                    answer = None
                elif exc.http_status_code < 500:  # a refusal (4xx), not an outage
                    msg = f"the schema registry at {self.settings.url} refused {what}: {exc}"
                    raise ContractError(msg) from exc
                else:
                    failures = self._wait(what, exc, started, failures)
                    continue
            except Exception as exc:  # httpx connection errors and timeouts: an outage
                failures = self._wait(what, exc, started, failures)
                continue
            if failures:
                logger.warning(
                    "schema registry at %s answers again (%s) after %d failed tries, %.1f s",
                    self.settings.url,
                    what,
                    failures,
                    time.monotonic() - started,
                )
            return answer

    def _wait(self, what: str, exc: Exception, started: float, failures: int) -> int:
        waited = time.monotonic() - started
        if waited >= self.settings.outage_wait_s:
            msg = (
                f"the schema registry at {self.settings.url} did not answer for {waited:.0f} s "
                f"({what}; {failures + 1} tries; last: {exc!r}). Operator action: bring it "
                "back; nothing was skipped."
            )
            raise SchemaRegistryUnavailableError(msg) from exc
        if failures == 0:
            logger.warning(
                "schema registry at %s does not answer (%s: %r): waiting up to %.0f s, "
                "no record is skipped",
                self.settings.url,
                what,
                exc,
                self.settings.outage_wait_s,
            )
        time.sleep(_RETRY_PAUSE_S[min(failures, len(_RETRY_PAUSE_S) - 1)])
        return failures + 1
