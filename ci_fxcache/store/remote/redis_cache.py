"""torch's own Redis remote caches: configure a job for them, check reachability, expire keys.

torch 2.13's `RedisRemoteCache` stores every entry under `pt2:<cache id>::<key>:c1`
(torch/_inductor/remote_cache.py), so `pt2:*` is exactly what torch wrote.
"""

from __future__ import annotations

import os
import re
from typing import Any

from ci_fxcache import names
from ci_fxcache.errors import CheckFailed, UsageError
from ci_fxcache.store.invalidate import InvalidationResult
from ci_fxcache.store.policies import Policy

URL_ENV = names.REDIS_URL_ENV
KEY_PATTERN = "pt2:*"
CONNECT_TIMEOUT_S = 2.0


def check_url(url: str, what: str = "--redis-url") -> str:
    """`url` when it is a Redis URL (redis://, rediss://, unix://), else a UsageError."""
    if not re.match(r"^(rediss?|unix)://", url):
        # The value is not repeated: a malformed URL may still carry a password.
        raise UsageError(f"{what} is not a Redis URL (use redis://host:port/db)")
    return url


OPT_IN_FLAG = "--redis-writers-run-code"


def check_signed_use(signing_key: str | None, opted_in: bool) -> None:
    """Refuse torch's Redis remote cache in a job with a signing key, unless the user says
    that whoever can write that Redis may run code in the job (UsageError).

    torch loads remote FX-graph entries with `pickle.loads`: an entry is code, and the
    signature covers the local store only. A warning would leave signed jobs loading unsigned
    code by default; the opt-in makes that a decision, with the risk in its name."""
    if signing_key and not opted_in:
        raise UsageError(
            "store redis with FXCACHE_SIGNING_KEY: torch loads Redis entries with pickle and "
            "the signature does not cover them, so whoever can write that Redis runs code in "
            f"this job; pass {OPT_IN_FLAG} (action input redis-writers-run-code: true) if only "
            "trusted jobs can write it (ACLs, rediss://, a private network), else use store local"
        )


def configured_url(url: str | None) -> str | None:
    """`--redis-url`, else `$FXCACHE_REDIS_URL`, else None."""
    return url or os.environ.get(URL_ENV) or None


def resolve_url(url: str | None) -> str:
    """`--redis-url`, else `$FXCACHE_REDIS_URL`; UsageError when unset or not a Redis URL."""
    url = configured_url(url)
    if not url:
        raise UsageError("the redis store needs --redis-url URL (or FXCACHE_REDIS_URL)")
    return check_url(url)


# Query arguments redis-py reads that hold no secret (every other one is redacted: redis-py
# turns any query argument into a connection keyword, `password`, `username` and the ssl_*
# paths and passphrases among them).
_PLAIN_QUERY_ARGS = frozenset(
    {
        "db", "socket_timeout", "socket_connect_timeout", "socket_keepalive",
        "retry_on_timeout", "max_connections", "health_check_interval", "protocol",
        "ssl_cert_reqs", "ssl_check_hostname", "decode_responses", "encoding",
    }
)  # fmt: skip


def redact(url: str) -> str:
    """The URL as it may be printed or written anywhere (logs, state files, results): no
    userinfo (`user:pass@`, `:pass@`, a password holding `@`), every query argument that may
    be a credential replaced by `***`, no fragment. The one place that decides it."""
    from urllib.parse import parse_qsl, quote, urlsplit

    try:
        parts = urlsplit(url)
    except ValueError:
        return f"{url.partition(':')[0][:10]}://***"
    host = parts.netloc.rpartition("@")[2]  # userinfo ends at the last '@' (urlsplit's rule)
    query = "&".join(
        f"{quote(name)}={quote(value) if name in _PLAIN_QUERY_ARGS else '***'}"
        for name, value in parse_qsl(parts.query, keep_blank_values=True)
    )
    return f"{parts.scheme}://{host}{parts.path}" + (f"?{query}" if query else "")


def _client(url: str) -> Any:
    try:
        import redis
    except ImportError as exc:
        raise OSError(
            "the redis package is not installed (pip install 'ci-fxcache[redis]')"
        ) from exc
    return redis.Redis.from_url(
        url, socket_connect_timeout=CONNECT_TIMEOUT_S, socket_timeout=CONNECT_TIMEOUT_S * 2
    )


def probe(url: str) -> str | None:
    """None when Redis answers PING within the timeouts, else what went wrong (one phrase)."""
    try:
        client = _client(url)
        try:
            client.ping()
        finally:
            client.close()
    except Exception as exc:  # any failure means local-only, never a failed job
        if "timeout" in type(exc).__name__.lower():
            return f"timed out after {CONNECT_TIMEOUT_S * 2:g} s"
        return f"{type(exc).__name__}: {exc}"
    return None


def job_env(url: str) -> dict[str, str]:
    """Environment that turns on torch's Redis-backed FX graph and autotune caches."""
    return {
        "TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE": "1",
        "TORCHINDUCTOR_AUTOTUNE_REMOTE_CACHE": "1",
        "TORCHINDUCTOR_REDIS_URL": url,
    }


def expire_idle(url: str, max_idle_s: float, dry_run: bool, batch: int = 500) -> dict[str, Any]:
    """Delete `pt2:` keys idle longer than `max_idle_s` (SCAN + OBJECT IDLETIME, pipelined).

    SCAN may return a key more than once (while Redis resizes its table), so every count is
    of distinct keys."""
    client = _client(url)
    seen: set[bytes] = set()
    victims: list[bytes] = []
    cursor = 0
    while True:
        cursor, batch_keys = client.scan(cursor=cursor, match=KEY_PATTERN, count=batch)
        keys = [key for key in dict.fromkeys(batch_keys) if key not in seen]
        if keys:
            seen.update(keys)
            pipe = client.pipeline(transaction=False)
            for key in keys:
                pipe.object("idletime", key)
            for key, idle in zip(keys, pipe.execute(raise_on_error=False), strict=True):
                if isinstance(idle, int) and idle > max_idle_s:
                    victims.append(key)
        if cursor == 0:
            break
    freed = 0
    removed = 0
    for start in range(0, len(victims), batch):
        chunk = victims[start : start + batch]
        pipe = client.pipeline(transaction=False)
        for key in chunk:
            pipe.memory_usage(key)
        freed += sum(x for x in pipe.execute(raise_on_error=False) if isinstance(x, int))
        if not dry_run:
            removed += client.unlink(*chunk)  # what Redis removed: another job may have been first
    client.close()
    return {
        "url": redact(url),
        "scanned": len(seen),
        "removed": removed,
        "would_remove": len(victims),
        "bytes": freed,
        "dry_run": dry_run,
    }


class IdleKeys:
    """`fxcache invalidate --redis`: the `pt2:` keys idle longer than `--max-age` (the store
    invalidation shape: store/invalidate.py)."""

    def __init__(self, url: str) -> None:
        self.url = url

    def invalidate(self, policy: Policy, dry_run: bool) -> InvalidationResult:
        """`expire_idle` by `policy.max_age_s` (UsageError without one); CheckFailed (exit 1)
        when Redis cannot be used."""
        if policy.max_age_s is None:
            raise UsageError("--redis needs --max-age (Redis keys are expired by idle time)")
        try:
            done = expire_idle(self.url, policy.max_age_s, dry_run)
        except Exception as exc:  # redis errors: the network or the server, not the user's input
            raise CheckFailed(f"Redis at {redact(self.url)}: {exc}") from exc
        return InvalidationResult([], {"redis": done})
