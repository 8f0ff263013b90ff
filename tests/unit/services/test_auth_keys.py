"""API keys, the parts without Redis: key format, hashing, scopes, statuses, the 401 paths."""

from __future__ import annotations

import hashlib
from typing import Annotated

import orjson
import pytest
import redis
from fastapi import Depends, FastAPI
from fastapi.testclient import TestClient

from refold.contracts.service_keys import ApiKeyKeys
from refold.contracts.settings import RedisSettings
from refold.deploy.cli import build_parser as refold_parser
from refold.deploy.keys_cli import build_parser
from refold.services.api.config import HttpSettings, ServeSettings
from refold.services.api.context import ServiceContext
from refold.services.api.errors import install_error_handlers
from refold.services.auth import SCOPES, ApiKey, ApiKeyStore, require
from refold.services.auth.errors import ApiKeySpecError, ApiKeyStoreError
from refold.services.auth.keys import _decode, hash_key, parse_key


class _NoRedis:
    """A client that fails the test if the code under test reaches Redis."""

    def __getattr__(self, name: str):
        pytest.fail(f"Redis was used ({name}) where no round trip is needed")


def _store(**kwargs) -> ApiKeyStore:
    return ApiKeyStore(_NoRedis(), "test", **kwargs)  # type: ignore[arg-type]


def test_key_format_and_id():
    key_id = "0123456789abcdef"
    assert parse_key(f"rfk_{key_id}_{'s' * 43}") == key_id
    # The secret of token_urlsafe may hold '_' and '-': only the first two '_' split.
    assert parse_key(f"rfk_{key_id}_a_b-c") == key_id
    for bad in (
        "",
        "rfk",
        f"rfk_{key_id}",
        f"rfk_{key_id}_",
        f"xyz_{key_id}_secret",
        "rfk_0123456789ABCDEF_secret",  # ids are lower-case hex
        "rfk_0123_secret",
        f"Bearer rfk_{key_id}_secret",
    ):
        assert parse_key(bad) is None, bad


def test_the_stored_hash_is_sha256_of_the_whole_key():
    key = "rfk_0123456789abcdef_secret"
    assert hash_key(key) == hashlib.sha256(key.encode()).hexdigest()
    assert hash_key(key) != hash_key(key + "x")


def test_admin_implies_every_scope():
    admin = ApiKey("0123456789abcdef", "ops", ("admin",), 0)
    query = ApiKey("0123456789abcdef", "dash", ("query",), 0)
    assert all(admin.allows(s) for s in SCOPES)
    assert query.allows("query")
    assert not query.allows("ingest")
    assert not query.allows("admin")


def test_status_revoked_wins_over_expired():
    key = ApiKey("0123456789abcdef", "ci", ("ingest",), 1_000, expires_at=2_000)
    assert key.status(1_999) == "active"
    assert key.status(2_000) == "expired"
    revoked = ApiKey("0123456789abcdef", "ci", ("ingest",), 1_000, 2_000, revoked_at=1_500)
    assert revoked.status(1_600) == "revoked"
    assert revoked.status(3_000) == "revoked"


def test_describe_never_holds_the_key_or_its_hash():
    described = ApiKey("0123456789abcdef", "ci", ("ingest", "query"), 5).describe()
    assert described == {
        "id": "0123456789abcdef",
        "name": "ci",
        "scopes": ["ingest", "query"],
        "created_at": 5,
        "expires_at": None,
        "revoked_at": None,
    }


@pytest.mark.parametrize(
    ("name", "scopes", "expires", "words"),
    [
        ("ok", ["read"], None, "unknown scope(s) read"),
        ("ok", [], None, "at least one scope"),
        ("", ["query"], None, "invalid key name"),
        ("-dash", ["query"], None, "invalid key name"),
        ("has space", ["query"], None, "invalid key name"),
        ("x" * 65, ["query"], None, "invalid key name"),
        ("0123456789abcdef", ["query"], None, "looks like a key id"),
        ("ok", ["query"], 0, "in the future"),
        ("ok", ["query"], -1, "in the future"),
    ],
)
def test_add_refuses_bad_specs_before_reaching_redis(name, scopes, expires, words):
    with pytest.raises(ApiKeySpecError, match="API_KEY_INVALID") as info:
        _store().add(name, scopes, expires_in_s=expires)
    assert words in str(info.value)


def test_a_malformed_key_is_refused_without_a_round_trip():
    store = _store(cache_s=1.0)
    assert store.lookup("not-a-key") is None
    assert store.verify("rfk_nothex_secret") is None
    assert store.cached("rfk_0123456789abcdef_secret") is None


def test_an_unreadable_record_is_a_store_error_naming_the_fix():
    with pytest.raises(ApiKeyStoreError, match="refold keys revoke"):
        _decode(b"{not json")
    with pytest.raises(ApiKeyStoreError):
        _decode(orjson.dumps({"id": "x"}))
    key, digest = _decode(
        orjson.dumps(
            {
                "id": "0123456789abcdef",
                "name": "n",
                "scopes": ["query", "future-scope"],
                "created_at": 1,
                "sha256": "ab",
            }
        )
    )
    assert key.scopes == ("query",)  # a scope this version does not know grants nothing
    assert (key.expires_at, key.revoked_at, digest) == (None, None, "ab")


def test_key_family_in_the_layout():
    assert ApiKeyKeys("p").registry == "p:{auth}:api_keys"


def test_require_refuses_an_unknown_scope():
    with pytest.raises(ApiKeySpecError, match="unknown scope 'read'"):
        require("read")  # type: ignore[arg-type]


def _app(auth: str = "keys") -> TestClient:
    settings = ServeSettings(
        redis=RedisSettings(url="redis://127.0.0.1:1/0", key_prefix="unit"),
        serve=HttpSettings(auth=auth),
    )
    app = FastAPI()
    install_error_handlers(app)
    # redis-py connects on first use only; these requests must never get that far.
    app.state.context = ServiceContext(settings, redis.Redis.from_url(settings.redis.url))

    @app.get("/q", dependencies=[Depends(require("query"))])
    def query() -> dict[str, str]:
        return {"ok": "query"}

    @app.get("/who")
    def who(key: Annotated[ApiKey | None, Depends(require("ingest"))]) -> dict[str, object]:
        return {"key": None if key is None else key.id}

    return TestClient(app)


def test_auth_off_lets_everything_through():
    client = _app("off")
    assert client.get("/q").json() == {"ok": "query"}
    assert client.get("/who", headers={"X-API-Key": "whatever"}).json() == {"key": None}


def test_no_key_is_a_401_saying_how_to_send_one():
    response = _app().get("/q")
    assert response.status_code == 401
    assert response.headers["WWW-Authenticate"].startswith("Bearer")
    error = response.json()["error"]
    assert error["code"] == "UNAUTHENTICATED"
    assert "Authorization: Bearer <key>" in error["message"]
    assert "X-API-Key" in error["message"]


def test_another_auth_scheme_is_named_in_the_401():
    response = _app().get("/q", headers={"Authorization": "Basic dXNlcjpwYXNz"})
    assert response.status_code == 401
    assert "'Basic' scheme, not Bearer" in response.json()["error"]["message"]
    assert 'error="invalid_token"' in response.headers["WWW-Authenticate"]


@pytest.mark.parametrize(
    "headers",
    [{"Authorization": "Bearer nonsense"}, {"X-API-Key": "rfk_short_x"}],
)
def test_a_malformed_key_is_a_401_unknown_key(headers):
    response = _app().get("/q", headers=headers)
    assert response.status_code == 401
    assert response.json()["error"]["message"].startswith("unknown API key")


def test_the_security_schemes_are_in_the_openapi_document():
    schema = _app().get("/openapi.json").json()
    schemes = schema["components"]["securitySchemes"]
    assert schemes["bearer"] == {
        "type": "http",
        "scheme": "bearer",
        "bearerFormat": "rfk_<id>_<secret>",
        "description": schemes["bearer"]["description"],
    }
    assert schemes["apiKey"]["in"] == "header"
    assert schemes["apiKey"]["name"] == "X-API-Key"
    assert {"bearer": []} in schema["paths"]["/q"]["get"]["security"]


def test_refold_keys_is_a_command_with_examples(capsys):
    with pytest.raises(SystemExit):
        refold_parser().parse_args(["--help"])
    assert "keys" in capsys.readouterr().out
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(["--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    for word in ("add", "list", "revoke", "--scope ingest", "Authorization: Bearer"):
        assert word in out
    with pytest.raises(SystemExit):
        build_parser().parse_args(["add", "--name", "x", "--scope", "read"])
    assert "invalid choice: 'read'" in capsys.readouterr().err
