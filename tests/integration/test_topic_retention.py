"""`refold topics` applies a TopicSpec's retention on the real broker: on create, and by altering.

A topic whose spec sets no retention keeps the broker's default and is never touched.
"""

from __future__ import annotations

from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

from refold.contracts import registry as registry_module
from refold.contracts.registry import ContractSet, Registry
from refold.contracts.topics import TopicSpec
from refold.deploy.cli import main as refold

DAY_MS, HOUR_MS, WEEK_MS = 86_400_000, 3_600_000, 604_800_000


def describe(admin: AdminClient, topic: str) -> dict[str, tuple[str, bool]]:
    """The topic's retention configs: value, and whether it is the broker's default."""
    resource = ConfigResource(ResourceType.TOPIC, topic)
    entries = admin.describe_configs([resource])[resource].result(timeout=30)
    return {
        key: (entries[key].value, entries[key].is_default)
        for key in ("retention.ms", "retention.bytes")
    }


def test_refold_topics_creates_alters_and_reports_retention(
    kafka_bootstrap, unique, tmp_path, monkeypatch, capsys
):
    kept, plain = f"kept-{unique}", f"plain-{unique}"

    def declare(retention_ms: int) -> None:
        topics = (
            TopicSpec(kept, 2, "id", ("E",), retention_ms=retention_ms, retention_bytes=1 << 30),
            TopicSpec(plain, 2, "id", ("E",)),
        )
        contracts = Registry([], [ContractSet("ret", tmp_path, topics)])
        monkeypatch.setattr(registry_module, "default_registry", lambda: contracts)

    def topics(*args: str) -> dict[str, str]:
        assert refold(["topics", *args]) == 0
        lines = capsys.readouterr().out.splitlines()
        return {line.split()[0]: line for line in lines if line.split()[0] in (kept, plain)}

    monkeypatch.setenv("REFOLD_KAFKA__BOOTSTRAP_SERVERS", kafka_bootstrap)
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    declare(DAY_MS)
    try:
        printed = topics("--dry-run")
        assert "retention 1d or 1GiB per partition  (would be created)" in printed[kept]
        assert "retention broker default  (would be created)" in printed[plain]
        assert not {kept, plain} & set(admin.list_topics(timeout=10).topics)

        printed = topics()
        assert printed[kept].endswith("(created)")
        assert describe(admin, kept) == {
            "retention.ms": (str(DAY_MS), False),
            "retention.bytes": (str(1 << 30), False),
        }
        default = describe(admin, plain)
        assert default["retention.ms"] == (str(WEEK_MS), True)  # the broker's 7 days

        # The spec changes: a dry run says what would change and changes nothing ...
        declare(HOUR_MS)
        change = f"retention.ms {DAY_MS} -> {HOUR_MS}"
        assert f"(would be altered: {change})" in topics("--dry-run")[kept]
        assert describe(admin, kept)["retention.ms"] == (str(DAY_MS), False)
        # ... the command alters it, says so per topic, and only what differs.
        printed = topics()
        assert printed[kept].endswith(f"(altered: {change})")
        assert "altered" not in printed[plain]
        assert describe(admin, kept) == {
            "retention.ms": (str(HOUR_MS), False),
            "retention.bytes": (str(1 << 30), False),
        }
        assert describe(admin, plain) == default  # no retention in its spec: untouched
        assert "altered" not in topics()[kept]  # applied: nothing left to change
    finally:
        for future in admin.delete_topics([kept, plain]).values():
            future.exception(timeout=30)
