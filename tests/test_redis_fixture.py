"""The shared redis-server fixture really is a Redis (other tests build on it)."""

from __future__ import annotations

import redis


def test_redis_server_answers(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url, socket_connect_timeout=2)
    client.set("fxcache:fixture", b"ok")
    assert client.get("fxcache:fixture") == b"ok"
    assert client.info("server")["redis_version"]
