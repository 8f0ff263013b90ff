"""The secured local stack: Kafka with SASL/SCRAM on a TLS listener, Redis with an ACL user.

``refold up --secure`` (and :class:`refold.deploy.local_stack.LocalStack` with ``secure=True``)
makes, on first start, under ``<state dir>/secrets`` (mode 0700, every file 0600):

- ``credentials.json``: one user name and two random passwords (Kafka's SCRAM, Redis' ACL);
- ``broker.p12``: a self-signed certificate for ``127.0.0.1``/``localhost`` and its key, made
  with the JDK's ``keytool`` (the broker's TLS listener);
- ``ca.pem``: that certificate, which clients trust (``ssl.ca.location``);
- ``users.acl``: Redis' users: ``default`` off, the refold user on with its password.

The broker formats its storage with the SCRAM credential (``--add-scram``), so a secured stack
must be secured from its first start. The passwords are never printed: ``refold up`` says where
they are, and :meth:`StackSecurity.kafka_settings` / :meth:`redis_settings` hand them to
clients as secrets (``SecretStr``).
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
from dataclasses import dataclass
from pathlib import Path

from pydantic import SecretStr

from refold.contracts.settings import KafkaSettings, RedisSettings

__all__ = ["SCRAM_MECHANISM", "StackSecurity"]

SCRAM_MECHANISM = "SCRAM-SHA-512"
_USER = "refold"
_KEYTOOL_TIMEOUT_S = 60


@dataclass(frozen=True, slots=True)
class StackSecurity:
    """The secrets folder of one secured local stack.

    Attributes:
        folder: ``<state dir>/secrets``.
        java: The ``java`` binary whose ``keytool`` makes the certificate.
    """

    folder: Path
    java: str

    @property
    def credentials_file(self) -> Path:
        """``{"user", "kafka_password", "redis_password", "store_password"}``."""
        return self.folder / "credentials.json"

    @property
    def keystore(self) -> Path:
        """The broker's certificate and key (PKCS12)."""
        return self.folder / "broker.p12"

    @property
    def truststore(self) -> Path:
        """The broker's trust store: :attr:`ca_file` (PKCS12)."""
        return self.folder / "trust.p12"

    @property
    def ca_file(self) -> Path:
        """The certificate clients trust (PEM)."""
        return self.folder / "ca.pem"

    @property
    def acl_file(self) -> Path:
        """redis-server's ``aclfile``."""
        return self.folder / "users.acl"

    def ensure(self) -> None:
        """Make what is missing: the credentials, the certificate, the Redis users."""
        self.folder.mkdir(parents=True, exist_ok=True)
        self.folder.chmod(0o700)
        if not self.credentials_file.is_file():
            _write_private(
                self.credentials_file,
                json.dumps(
                    {
                        "user": _USER,
                        "kafka_password": secrets.token_urlsafe(24),
                        "redis_password": secrets.token_urlsafe(24),
                        "store_password": secrets.token_urlsafe(24),
                    }
                ),
            )
        if not all(f.is_file() for f in (self.keystore, self.truststore, self.ca_file)):
            self._make_certificate()
        user, password = self._credentials["user"], self._credentials["redis_password"]
        _write_private(self.acl_file, f"user default off\nuser {user} on >{password} ~* &* +@all\n")

    @property
    def _credentials(self) -> dict[str, str]:
        loaded: dict[str, str] = json.loads(self.credentials_file.read_text())
        return loaded

    def _keytool(self, *args: str) -> None:
        keytool = str(Path(self.java).with_name("keytool"))
        done = subprocess.run(  # noqa: S603 - fixed argv, no shell
            [keytool, *args],
            capture_output=True,
            text=True,
            timeout=_KEYTOOL_TIMEOUT_S,
            check=False,
        )
        if done.returncode != 0:
            msg = f"keytool {args[0]} failed: {done.stderr.strip() or done.stdout.strip()}"
            raise RuntimeError(msg)

    def _make_certificate(self) -> None:
        store = ["-keystore", str(self.keystore), "-storetype", "PKCS12"]
        password = ["-storepass", self._credentials["store_password"]]
        self.keystore.unlink(missing_ok=True)
        self._keytool(
            "-genkeypair",
            "-alias",
            "broker",
            "-keyalg",
            "RSA",
            "-keysize",
            "2048",
            "-validity",
            "3650",
            "-dname",
            "CN=localhost",
            "-ext",
            "SAN=ip:127.0.0.1,dns:localhost",
            *store,
            *password,
        )
        self._keytool(
            "-exportcert", "-rfc", "-alias", "broker", "-file", str(self.ca_file), *store, *password
        )
        # The broker trusts the same certificate when it talks to itself (inter-broker).
        self.truststore.unlink(missing_ok=True)
        self._keytool(
            "-importcert",
            "-noprompt",
            "-alias",
            "ca",
            "-file",
            str(self.ca_file),
            "-keystore",
            str(self.truststore),
            "-storetype",
            "PKCS12",
            *password,
        )
        for made in (self.keystore, self.truststore, self.ca_file):
            made.chmod(0o600)

    def broker_properties(self, port: int, controller_port: int) -> str:
        """The listener lines of ``server.properties`` (the file is written 0600)."""
        creds = self._credentials
        jaas = (
            "org.apache.kafka.common.security.scram.ScramLoginModule required "
            f'username="{creds["user"]}" password="{creds["kafka_password"]}";'
        )
        return (
            f"listeners=SASL_SSL://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}\n"
            f"advertised.listeners=SASL_SSL://127.0.0.1:{port}\n"
            "inter.broker.listener.name=SASL_SSL\n"
            "listener.security.protocol.map=SASL_SSL:SASL_SSL,CONTROLLER:PLAINTEXT\n"
            f"sasl.enabled.mechanisms={SCRAM_MECHANISM}\n"
            f"sasl.mechanism.inter.broker.protocol={SCRAM_MECHANISM}\n"
            f"listener.name.sasl_ssl.{SCRAM_MECHANISM.lower()}.sasl.jaas.config={jaas}\n"
            f"ssl.keystore.location={self.keystore}\n"
            "ssl.keystore.type=PKCS12\n"
            f"ssl.keystore.password={creds['store_password']}\n"
            f"ssl.truststore.location={self.truststore}\n"
            "ssl.truststore.type=PKCS12\n"
            f"ssl.truststore.password={creds['store_password']}\n"
        )

    def format_arguments(self) -> list[str]:
        """The SCRAM credential for ``kafka-storage format`` (the broker's first start)."""
        creds = self._credentials
        return [
            "--add-scram",
            f"{SCRAM_MECHANISM}=[name={creds['user']},password={creds['kafka_password']}]",
        ]

    def redis_arguments(self) -> list[str]:
        """redis-server's options for its users (the passwords stay in the 0600 file)."""
        return ["--aclfile", str(self.acl_file)]

    def kafka_settings(self, bootstrap_servers: str) -> KafkaSettings:
        """Client settings for the secured broker, the password as a secret."""
        return KafkaSettings(
            bootstrap_servers=bootstrap_servers,
            client_properties={
                "security.protocol": "SASL_SSL",
                "sasl.mechanisms": SCRAM_MECHANISM,
                "sasl.username": self._credentials["user"],
                "ssl.ca.location": str(self.ca_file),
            },
            secret_properties={"sasl.password": SecretStr(self._credentials["kafka_password"])},
        )

    def redis_settings(self, url: str, key_prefix: str) -> RedisSettings:
        """Client settings for the Redis ACL user, the password as a secret."""
        return RedisSettings(
            url=url,
            key_prefix=key_prefix,
            username=self._credentials["user"],
            password=SecretStr(self._credentials["redis_password"]),
        )


def _write_private(path: Path, text: str) -> None:
    """Write ``text`` to a file only its owner can read, from its creation on."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        handle.write(text)
