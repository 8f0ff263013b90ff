import json

import pytest

from refold.contracts.catalog import SchemaCatalog, default_catalog
from refold.contracts.compat import check_backward_transitive, check_catalog
from refold.contracts.errors import SchemaIncompatibleError


def test_shipped_schemas_are_backward_transitive():
    check_catalog(default_catalog())


def _family_with(tmp_path, new_v3: dict) -> SchemaCatalog:
    catalog = default_catalog()
    for version in catalog.versions("OrderPlaced"):
        (tmp_path / version.path.name).write_text(version.path.read_text())
    (tmp_path / "OrderPlaced.v3.avsc").write_text(json.dumps(new_v3))
    return SchemaCatalog.from_directory(tmp_path)


def test_new_field_without_default_is_rejected(tmp_path):
    v3 = json.loads(default_catalog().latest("OrderPlaced").path.read_text())
    v3["fields"].append({"name": "loyalty_tier", "type": "string"})
    catalog = _family_with(tmp_path, v3)
    problems = check_backward_transitive(catalog.versions("OrderPlaced"))
    assert {(p.reader.version, p.writer.version) for p in problems} == {(3, 1), (3, 2)}
    assert "loyalty_tier" in str(problems[0])
    with pytest.raises(SchemaIncompatibleError, match="Operator action"):
        check_catalog(catalog)


def test_incompatible_type_change_is_rejected(tmp_path):
    v3 = json.loads(default_catalog().latest("OrderPlaced").path.read_text())
    for field in v3["fields"]:
        if field["name"] == "currency":
            field["type"] = "int"
    with pytest.raises(SchemaIncompatibleError, match=r"currency|type"):
        check_catalog(_family_with(tmp_path, v3))


def test_removing_a_defaulted_field_stays_compatible_with_the_old_ones(tmp_path):
    v3 = json.loads(default_catalog().latest("OrderPlaced").path.read_text())
    v3["fields"] = [f for f in v3["fields"] if f["name"] != "coupon_code"]
    check_catalog(_family_with(tmp_path, v3))
