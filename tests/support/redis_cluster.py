"""A module's Redis is a real local cluster: import both fixtures into a test module.

``redis_cluster`` starts 3 masters with 1 replica each (as `refold up --redis-cluster`), once
per module; ``redis_url`` overrides the session's single redis-server, so every fixture and
scenario of the module (and those it imports from other modules) runs on the cluster.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from refold.deploy.redis_cluster import LocalRedisCluster, free_port_run


@pytest.fixture(scope="module")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRedisCluster]:
    home = tmp_path_factory.mktemp("redis-cluster")
    with LocalRedisCluster(home, free_port_run(6), persistent=False) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def redis_url(redis_cluster: LocalRedisCluster) -> str:
    """Every fixture and scenario of the module reaches Redis through the cluster."""
    return redis_cluster.url
