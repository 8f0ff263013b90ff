"""Redis refusing a client's login: one error that names the client and the user, never a secret.

redis-py raises ``AuthenticationError`` for a wrong password or ACL user, and it is a subclass of
``ConnectionError``: refold's outage waits, which wait out a Redis that is away for a moment,
took a wrong password for an outage and waited (a processor for its whole start budget, then
said "unreachable"). Every such wait asks :func:`raise_if_refused` first.
"""

from __future__ import annotations

import redis

from refold.contracts.errors import RefoldError
from refold.contracts.store.connect import is_cluster

__all__ = ["RedisCredentialsError", "raise_if_refused", "redis_refused"]


class RedisCredentialsError(RefoldError):
    """Redis refused a client's ACL user or password."""

    code = "REDIS_CREDENTIALS_REFUSED"
    retriable = False


def redis_refused(who: str, client: redis.Redis, reason: object) -> RedisCredentialsError:
    """The error for ``who`` (e.g. "the processor order_state") whose login Redis refused.

    Args:
        who: Who connected, as a user would name it.
        client: The refused client; only its host, port and user are shown.
        reason: redis-py's error.
    """
    if is_cluster(client):  # the node it first reached stands for the cluster
        kwargs = client.get_default_node().redis_connection.connection_pool.connection_kwargs  # type: ignore[attr-defined]
    else:
        kwargs = client.connection_pool.connection_kwargs
    user = kwargs.get("username") or "default"
    return RedisCredentialsError(
        f"Redis at {kwargs.get('host')}:{kwargs.get('port')} refused the credentials of {who} "
        f"(user {user!r}): {reason}. Operator action: check REFOLD_REDIS__USERNAME and "
        "REFOLD_REDIS__PASSWORD."
    )


def raise_if_refused(exc: BaseException, who: str, client: redis.Redis) -> None:
    """Raise :class:`RedisCredentialsError` when ``exc`` is Redis refusing ``client``'s login.

    Raises:
        RedisCredentialsError: ``exc`` is a ``redis.AuthenticationError``.
    """
    if isinstance(exc, redis.AuthenticationError):
        raise redis_refused(who, client, exc) from exc
