"""The lock of published schema versions: refused at catalog load, in the CLI and in the SDK."""

import json
from pathlib import Path
from typing import Any

import pytest

import refold.contracts.registry
from refold.contracts.catalog import SchemaCatalog, default_catalog
from refold.contracts.codec import EventCodec
from refold.contracts.errors import SchemaIncompatibleError, SchemaLockError, SchemaUnlockedError
from refold.contracts.lock import (
    PublishGate,
    SchemaLock,
    default_publish_gate,
    relock,
    verified_catalog,
    verify,
    versions_of,
)
from refold.contracts.registry import ContractSet, Registry, default_registry
from refold.contracts.settings import KafkaSettings
from refold.contracts.topics import TopicSpec
from refold.deploy.contracts_cli import main as contracts_main
from refold.services.producer.publisher import EventPublisher

SHIPPED = default_catalog()
TOPIC = TopicSpec("shop.orders", 1, "order_id", ("OrderPlaced",))
EVENT = {
    "event_id": "e-1",
    "order_id": "o-1",
    "customer_id": "c-1",
    "lines": [{"sku": "sku-1", "qty": 1, "unit_price_minor": 250}],
    "currency": "EUR",
    "placed_at": 1_700_000_000_000,
}


def _lock(contract_set):
    """What `refold contracts lock` does for one set: the new lock, written; what it published."""
    text, published = relock(contract_set)
    contract_set.lock_path.write_text(text)
    return published


@pytest.fixture
def shop(tmp_path: Path) -> ContractSet:
    """A contract set with OrderPlaced v1 and v2, both published (locked)."""
    schemas = tmp_path / "schemas"
    schemas.mkdir()
    for version in SHIPPED.versions("OrderPlaced"):
        (schemas / version.path.name).write_text(version.path.read_text())
    contract_set = ContractSet("shop", schemas, (TOPIC,))
    assert [(v.name, v.version) for v in _lock(contract_set)] == [
        ("OrderPlaced", 1),
        ("OrderPlaced", 2),
    ]
    return contract_set


def _edit(contract_set: ContractSet, file: str, change: Any) -> None:
    path = contract_set.schemas / file
    schema = json.loads(path.read_text())
    change(schema)
    path.write_text(json.dumps(schema, indent=2))


def _add_v3(contract_set: ContractSet, new_field: dict[str, Any]) -> None:
    schema = json.loads((contract_set.schemas / "OrderPlaced.v2.avsc").read_text())
    schema["fields"].append(new_field)
    (contract_set.schemas / "OrderPlaced.v3.avsc").write_text(json.dumps(schema))


class _Message:
    def __init__(self, topic: str, offset: int) -> None:
        self._topic, self._offset = topic, offset

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return self._offset


class _RecordingProducer:
    """Stands in for confluent_kafka.Producer: records produce calls, acknowledges on flush."""

    def __init__(self) -> None:
        self.produced: list[tuple[str, bytes]] = []
        self._pending: list[Any] = []

    def produce(self, topic: str, value: bytes, key: bytes, on_delivery: Any) -> None:
        self.produced.append((topic, value))
        self._pending.append((on_delivery, _Message(topic, len(self.produced) - 1)))

    def poll(self, timeout: float) -> int:
        return self.flush(timeout)

    def flush(self, timeout: float) -> int:
        pending, self._pending = self._pending, []
        for callback, message in pending:
            callback(None, message)
        return 0


def _publisher(contract_set: ContractSet, **options: Any) -> tuple[EventPublisher, Any]:
    """A publisher over the set's files and locks, with no broker: its producer records."""
    catalog = SchemaCatalog.from_directory(contract_set.schemas)
    publisher = EventPublisher(
        KafkaSettings(bootstrap_servers="127.0.0.1:9"),
        codec=EventCodec(catalog),
        topics=[TOPIC],
        gate=PublishGate.for_contract_sets([contract_set]),
        **options,
    )
    producer = _RecordingProducer()
    publisher._producer = producer  # type: ignore[assignment]
    return publisher, producer


def _check(contract_set: ContractSet, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = contracts_main(["check"], registry=Registry([], [contract_set]))
    return code, capsys.readouterr().out


def test_lock_file_is_sorted_text_with_a_header_and_relocking_changes_nothing(shop):
    text = shop.lock_path.read_text()
    assert text.startswith("# ")
    assert "refold contracts lock" in text
    lines = [line for line in text.splitlines() if not line.startswith("#")]
    v1, v2 = SHIPPED.versions("OrderPlaced")
    assert lines[0].startswith(f"OrderPlaced 1 {v1.fingerprint_hex} ")
    assert lines[1].startswith(f"OrderPlaced 2 {v2.fingerprint_hex} ")
    assert _lock(shop) == []
    assert shop.lock_path.read_text() == text


def test_changed_published_version_is_refused_at_load_in_check_and_in_the_sdk(
    shop, monkeypatch, capsys
):
    before = SHIPPED.versions("OrderPlaced")[0].fingerprint_hex
    _edit(shop, "OrderPlaced.v1.avsc", lambda s: s["fields"].pop())  # drops placed_at
    after = SchemaCatalog.from_directory(shop.schemas).versions("OrderPlaced")[0].fingerprint_hex

    (problem,) = verify(shop, versions_of(shop))
    assert problem.kind == "changed"
    assert str(problem) == (
        f"shop: OrderPlaced v1 was published with fingerprint {before}; the file now has {after}. "
        "Published versions are immutable: revert the edit and add OrderPlaced.v3.avsc instead."
    )
    with pytest.raises(SchemaLockError, match="Operator action") as info:
        verified_catalog([shop])
    assert info.value.code == "SCHEMA_LOCK_VIOLATED"

    # The real load path: default_catalog() over the installed contract sets.
    monkeypatch.setattr(refold.contracts.registry, "default_registry", lambda: Registry([], [shop]))
    default_catalog.cache_clear()
    try:
        with pytest.raises(SchemaLockError, match="OrderPlaced v1 was published"):
            default_catalog()
    finally:
        default_catalog.cache_clear()

    code, out = _check(shop, capsys)
    assert code == 1
    assert "CHANGED since published" in out
    assert "OrderPlaced v1 was published" in out

    with pytest.raises(SchemaLockError):
        _lock(shop)

    publisher, producer = _publisher(shop, allow_unlocked=True)
    with pytest.raises(SchemaLockError, match="the producer refuses OrderPlaced events"):
        publisher.emit("OrderPlaced", {**EVENT, "channel": "web", "coupon_code": None})
    assert producer.produced == []


def test_a_default_edit_keeps_the_fingerprint_but_is_refused(shop):
    def other_default(schema: dict[str, Any]) -> None:
        next(f for f in schema["fields"] if f["name"] == "channel")["default"] = "app"

    _edit(shop, "OrderPlaced.v2.avsc", other_default)
    (problem,) = verify(shop, versions_of(shop))
    assert problem.kind == "changed"
    assert "defaults, logical types or aliases changed" in problem.message


def test_a_doc_edit_is_not_a_change(shop):
    _edit(shop, "OrderPlaced.v1.avsc", lambda s: s.update(doc="Reworded."))
    assert verify(shop, versions_of(shop)) == []


def test_deleted_published_version_is_refused(shop, capsys):
    (shop.schemas / "OrderPlaced.v1.avsc").unlink()
    (problem,) = verify(shop, versions_of(shop))
    assert problem.kind == "deleted"
    assert "OrderPlaced.v1.avsc is gone" in problem.message
    with pytest.raises(SchemaLockError):
        verified_catalog([shop])
    code, out = _check(shop, capsys)
    assert code == 1
    assert "DELETED" in out


def test_new_incompatible_version_is_refused_everywhere(shop, capsys):
    _add_v3(shop, {"name": "loyalty_tier", "type": "string"})  # no default: v3 cannot read v1/v2
    locked = shop.lock_path.read_text()

    (problem,) = verify(shop, versions_of(shop))
    assert (problem.kind, problem.version) == ("incompatible", 3)
    assert "loyalty_tier" in problem.message
    assert "cannot read v1" in problem.message
    assert "cannot read v2" in problem.message
    with pytest.raises(SchemaIncompatibleError, match="BACKWARD_TRANSITIVE"):
        verified_catalog([shop])
    with pytest.raises(SchemaIncompatibleError):
        _lock(shop)
    assert shop.lock_path.read_text() == locked

    code, out = _check(shop, capsys)
    assert code == 1
    assert "new, INCOMPATIBLE" in out
    assert contracts_main(["lock"], registry=Registry([], [shop])) == 1
    assert shop.lock_path.read_text() == locked

    publisher, producer = _publisher(shop, allow_unlocked=True)  # never lets this through
    with pytest.raises(SchemaIncompatibleError):
        publisher.emit("OrderPlaced", {**EVENT, "loyalty_tier": "gold"})
    assert producer.produced == []


def test_new_compatible_version_loads_is_not_published_until_locked(shop, capsys):
    _add_v3(shop, {"name": "loyalty_tier", "type": "string", "default": "none"})
    event = {**EVENT, "channel": "web", "coupon_code": None, "loyalty_tier": "gold"}

    assert verify(shop, versions_of(shop)) == []
    assert verified_catalog([shop]).latest("OrderPlaced").version == 3  # processors can use it
    code, out = _check(shop, capsys)
    assert code == 0
    assert "new, not locked" in out

    publisher, producer = _publisher(shop)
    with pytest.raises(SchemaUnlockedError, match=r"OrderPlaced v3 .* is not published"):
        publisher.emit("OrderPlaced", event)
    assert producer.produced == []

    publisher, producer = _publisher(shop, allow_unlocked=True)
    publisher.emit("OrderPlaced", event)
    assert len(producer.produced) == 1

    assert contracts_main(["lock", "shop"], registry=Registry([], [shop])) == 0
    assert SchemaLock.read(shop.lock_path).get("OrderPlaced", 3) is not None
    publisher, producer = _publisher(shop)
    token = publisher.emit("OrderPlaced", event)
    assert (token.topic, len(producer.produced)) == ("shop.orders", 1)


def test_malformed_lock_names_the_line(shop):
    shop.lock_path.write_text(shop.lock_path.read_text() + "OrderPlaced 3 nothex\n")
    with pytest.raises(SchemaLockError, match=r"contracts.lock:\d+ is not <record>"):
        SchemaLock.read(shop.lock_path)


@pytest.mark.parametrize("name", sorted(default_registry().contract_sets))
def test_shipped_locks_match_the_shipped_schemas(name):
    contract_set = default_registry().contract_sets[name]
    versions = versions_of(contract_set)
    assert contract_set.lock_path.exists(), f"run `refold contracts lock {name}` and commit it"
    assert verify(contract_set, versions) == []
    assert SchemaLock.read(contract_set.lock_path) == SchemaLock.of(versions)  # all published
    gate = default_publish_gate()
    for record in {v.name for v in versions}:
        gate.check(SHIPPED.latest(record))
