"""One way to a Redis client: a single redis-server, or a Redis Cluster, from one URL.

Every refold process (processors, readers, HTTP services, replay, webhooks, the CLIs) opens
Redis here, so a deployment chooses single server or cluster by its URL alone:

- ``redis://host:port/0`` (``rediss://`` for TLS): one server, redis-py's ``Redis``;
- ``redis+cluster://host:port`` (``rediss+cluster://``): a Redis Cluster, reached through any
  of its nodes; redis-py's ``RedisCluster`` learns the others and routes each command to the
  node that owns its key's slot. ``redis+cluster://h1:p1,h2:p2,h3:p3`` names several, so that
  a client can start while one of them is down (a failed master). A cluster has one database,
  so a ``/0`` path is ignored.

refold keeps every multi-key transaction in one slot by hash tags (:mod:`refold.contracts.layout`),
which is what lets the cluster client run them (redis-py's cluster pipelines with
``transaction=True`` refuse keys of several slots with ``CrossSlotTransactionError``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, cast

import redis
import redis.asyncio
from redis.cluster import ClusterNode, RedisCluster

__all__ = [
    "CLUSTER_SCHEMES",
    "async_redis_client",
    "is_cluster",
    "is_cluster_url",
    "pipelined_eval",
    "pipelined_mget",
    "pipelined_mset",
    "pipelined_pfcount",
    "redis_client",
    "single_server_url",
    "unreachable",
]

# The cluster schemes, and the scheme redis-py parses each as.
CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}


def is_cluster_url(url: str) -> bool:
    """Whether ``url`` names a Redis Cluster (``redis+cluster://`` or ``rediss+cluster://``)."""
    return url.partition("://")[0] in CLUSTER_SCHEMES


def single_server_url(url: str) -> str:
    """``url`` with a plain ``redis://``/``rediss://`` scheme (redis-py's own parsers need it)."""
    scheme, sep, rest = url.partition("://")
    return f"{CLUSTER_SCHEMES[scheme]}{sep}{rest}" if scheme in CLUSTER_SCHEMES else url


def redis_client(url: str, **options: Any) -> redis.Redis:
    """A client for the server or cluster ``url`` names (``options`` go to redis-py as they are).

    The cluster client is typed as ``redis.Redis``: refold uses the commands both share, and
    the same code runs against a real cluster in ``tests/integration/test_redis_cluster.py``.
    """
    if not is_cluster_url(url):
        return redis.Redis.from_url(url, **options)
    plain = single_server_url(url)
    scheme, _, rest = plain.partition("://")
    # A cluster has database 0 only; redis-py's cluster client refuses a ``/N`` path.
    location = rest.split("/", 1)[0]
    credentials, at, hosts = location.rpartition("@")
    first, *others = hosts.split(",")
    # Several nodes (``host:port,host:port``): a client starting while one is down learns the
    # cluster from another, as redis-py's startup nodes do.
    startup = [ClusterNode(*_host_port(node)) for node in others]  # type: ignore[no-untyped-call]
    client = RedisCluster(
        url=f"{scheme}://{credentials}{at}{first}", startup_nodes=startup, **options
    )
    return cast("redis.Redis", client)


def async_redis_client(url: str, **options: Any) -> redis.asyncio.Redis:
    """An asyncio client (redis-py's ``redis.asyncio``) of the single server ``url`` names.

    For code on an event loop, where a blocking call would hold the loop for its round trip.
    Its connections belong to the loop that first uses them: one client per loop.

    Raises:
        ValueError: ``url`` names a cluster (refold's asyncio reads are single-server only).
    """
    if is_cluster_url(url):
        msg = f"no asyncio client for a Redis Cluster ({url.partition('://')[0]}://)"
        raise ValueError(msg)
    return redis.asyncio.Redis.from_url(url, **options)


def _host_port(node: str) -> tuple[str, int]:
    host, _, port = node.rpartition(":")
    return host.strip("[]"), int(port)


# redis-py's cluster pipelines refuse MGET, MSET and PFCOUNT by their method names, even when
# every key is in one slot (as refold's transactions keep them). Sent as plain commands they run
# on both clients, with the same reply parsing; a cross-slot call is still refused by Redis.
def pipelined_mget(pipe: Any, keys: Sequence[str]) -> Any:
    """``MGET keys`` on a pipeline of either client (queued, or run at once while WATCHing)."""
    return pipe.execute_command("MGET", *keys)


def pipelined_mset(pipe: Any, mapping: Mapping[str, Any]) -> Any:
    """``MSET`` of ``mapping`` on a pipeline of either client."""
    return pipe.execute_command("MSET", *[part for pair in mapping.items() for part in pair])


def pipelined_pfcount(pipe: Any, *keys: str) -> Any:
    """``PFCOUNT keys`` on a pipeline of either client."""
    return pipe.execute_command("PFCOUNT", *keys)


def is_cluster(client: redis.Redis) -> bool:
    """Whether ``client`` is a Redis Cluster client (:func:`redis_client` of a cluster URL)."""
    return isinstance(client, RedisCluster)


def pipelined_eval(pipe: Any, script: str, numkeys: int, *keys_and_args: Any) -> Any:
    """``EVAL script`` on a pipeline of either client (a cluster pipeline's ``eval`` takes none)."""
    return pipe.execute_command("EVAL", script, numkeys, *keys_and_args)


def unreachable(error: redis.ConnectionError) -> str:
    """What a command says when Redis does not answer: why, where and what to do.

    redis-py's reason names the address it tried (``Error 111 connecting to host:port``).
    """
    return (
        f"cannot reach Redis: {str(error).rstrip('.')}. Operator action: start it (`refold up` "
        "starts the local stack) or set REFOLD_REDIS__URL to where it runs."
    )
