"""Which client a Redis URL opens, and the registry names across the hash-tag rename (pure)."""

from __future__ import annotations

import redis
from redis.cluster import RedisCluster

from refold.contracts.layout import StateLayout, processor_of_registry_key
from refold.contracts.settings import RedisSettings
from refold.contracts.store import connect
from refold.contracts.store.connect import (
    is_cluster,
    is_cluster_url,
    redis_client,
    single_server_url,
)


def test_a_cluster_url_is_told_by_its_scheme():
    assert is_cluster_url("redis+cluster://127.0.0.1:7000")
    assert is_cluster_url("rediss+cluster://user:pw@h:7000/0")
    assert not is_cluster_url("redis://127.0.0.1:6379/0")
    assert not is_cluster_url("rediss://h:6380")
    assert single_server_url("rediss+cluster://user:pw@h:7000") == "rediss://user:pw@h:7000"
    assert single_server_url("redis://h:1/2") == "redis://h:1/2"


def test_a_single_server_url_opens_redis_without_connecting():
    client = redis_client("redis://127.0.0.1:1/3", socket_timeout=2)
    assert isinstance(client, redis.Redis)
    assert not is_cluster(client)
    kwargs = client.connection_pool.connection_kwargs
    assert (kwargs["port"], kwargs["db"], kwargs["socket_timeout"]) == (1, 3, 2)


def test_settings_put_the_credentials_into_the_url_they_open():
    settings = RedisSettings(url="redis://127.0.0.1:1/0", username="u", password="pw")  # noqa: S106
    kwargs = settings.client().connection_pool.connection_kwargs
    assert (kwargs["username"], kwargs["password"]) == ("u", "pw")


def test_the_cluster_client_is_redis_py_s_with_every_node_of_the_url(monkeypatch):
    seen = []

    class Cluster:  # no cluster to reach in a unit test
        def __init__(self, **options):
            seen.append(options)

    monkeypatch.setattr(connect, "RedisCluster", Cluster)
    assert isinstance(redis_client("redis+cluster://h:7000/0", socket_timeout=1), Cluster)
    assert seen[-1] == {"url": "redis://h:7000", "startup_nodes": [], "socket_timeout": 1}
    redis_client("rediss+cluster://u:pw@h1:7000,h2:7001,[::1]:7002/0")
    options = seen[-1]
    assert options["url"] == "rediss://u:pw@h1:7000"  # the credentials go to every node
    assert [(n.host, n.port) for n in options["startup_nodes"]] == [("h2", 7001), ("::1", 7002)]
    assert RedisCluster is not Cluster


def test_registry_keys_share_the_processor_s_tag_and_old_names_are_still_found():
    layout = StateLayout("order_state", "refold")
    assert layout.alias == "refold:{order_state}:live"
    assert layout.generations == "refold:{order_state}:generations"
    assert layout.flips == "refold:{order_state}:flips"
    assert layout.legacy_registry == ("refold:order_state:live", "refold:order_state:generations")
    assert processor_of_registry_key(layout.generations, "refold") == "order_state"
    assert processor_of_registry_key("refold:order_state:generations", "refold") == "order_state"
    assert processor_of_registry_key("refold:{a:b}:generations", "refold") is None
