"""Redis refusing a login is named as such, with the client, host and user, never the password."""

from __future__ import annotations

import pytest
import redis

from refold.contracts.store.credentials import RedisCredentialsError, raise_if_refused


def test_a_refused_login_names_the_client_and_the_user_and_never_the_password():
    client = redis.Redis.from_url("redis://refold:s3cret-pw@127.0.0.1:6390/0")
    refusal = redis.AuthenticationError("invalid username-password pair or user is disabled.")
    with pytest.raises(RedisCredentialsError) as raised:
        raise_if_refused(refusal, "the processor order_state", client)
    message = str(raised.value)
    assert raised.value.code == "REDIS_CREDENTIALS_REFUSED"
    assert "Redis at 127.0.0.1:6390 refused the credentials of the processor order_state" in message
    assert "(user 'refold')" in message
    assert "REFOLD_REDIS__PASSWORD" in message
    assert "s3cret-pw" not in message


def test_an_outage_is_not_a_refusal():
    client = redis.Redis.from_url("redis://127.0.0.1:6390/0")
    raise_if_refused(redis.ConnectionError("Connection refused"), "replay", client)  # no raise
