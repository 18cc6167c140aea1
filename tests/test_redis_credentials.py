"""Issue 26 §5: a Redis URL's credentials never reach anything printed or written.

Each URL shape redis-py accepts carries the password somewhere else: userinfo (`user:pass@`,
`:pass@`, a password holding `@`), the `password` query argument, a unix socket's userinfo or
query. A real redis-server that requires the password proves each URL really authenticates.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
import redis
from redis.connection import parse_url

from ci_fxcache.store.remote.redis_cache import redact
from tests.conftest import TORCH_PYTHON, RunFxcache, free_port

PASSWORD = "s3:cr@t/pw"  # ':' '@' and '/' are where hand-written redaction breaks
SIMPLE = "s3cr@tpw"  # raw in userinfo (no '/'), as redis-py reads `redis://u:p@ss@h`


def _shapes(port: int, sock: str) -> dict[str, tuple[str, str]]:
    """name -> (URL, the password it carries)."""
    return {
        "user-pass": (f"redis://default:{quote(PASSWORD, safe='')}@127.0.0.1:{port}/3", PASSWORD),
        "colon-pass": (f"redis://:{quote(PASSWORD, safe='')}@127.0.0.1:{port}/3", PASSWORD),
        "raw-at": (f"redis://raw:{SIMPLE}@127.0.0.1:{port}/3", SIMPLE),
        "query": (
            f"redis://127.0.0.1:{port}/3?password={quote(PASSWORD, safe='')}&db=3",
            PASSWORD,
        ),
        "query-user": (
            f"redis://127.0.0.1:{port}?username=default&password={quote(PASSWORD, safe='')}",
            PASSWORD,
        ),
        "unix-userinfo": (f"unix://:{quote(PASSWORD, safe='')}@{sock}?db=3", PASSWORD),
        "unix-query": (f"unix://{sock}?db=3&password={quote(PASSWORD, safe='')}", PASSWORD),
    }


def _leaks(text: str, password: str) -> list[str]:
    forms = {password, quote(password, safe=""), quote(password)}
    return [f for f in forms if f in text]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, str]]:
    """A redis-server whose default user needs PASSWORD, on TCP and on a unix socket."""
    exe = shutil.which("redis-server")
    if exe is None:
        pytest.fail("redis-server is not installed: run the README's test set-up command")
    work = tmp_path_factory.mktemp("redis-auth")
    port, sock = free_port(), str(work / "redis.sock")
    proc = subprocess.Popen(
        [exe, "--port", str(port), "--bind", "127.0.0.1", "--unixsocket", sock,
         "--save", "", "--appendonly", "no", "--dir", str(work), "--requirepass", PASSWORD],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    client = redis.Redis(host="127.0.0.1", port=port, password=PASSWORD)
    for _ in range(300):
        try:
            client.ping()
            break
        except redis.RedisError:
            if proc.poll() is not None:
                pytest.fail("redis-server did not start")
            time.sleep(0.05)
    client.acl_setuser("raw", enabled=True, passwords=[f"+{SIMPLE}"], commands=["+@all"])
    yield port, sock
    proc.terminate()
    proc.wait(timeout=10)


@pytest.mark.parametrize(
    "url",
    [
        "redis://user:pw-1@h:6379/0",
        "redis://:p@ss@h",
        "rediss://u:p%40w@cache.internal:6380/2?ssl_cert_reqs=required",
        "redis://h/0?password=pw-1&ssl_password=pw-2&ssl_keyfile=/secret/k.pem",
        "unix://:pw-1@/run/redis.sock?db=1",
        "unix:///run/redis.sock?password=pw-1",
        "redis://h/0#pw-1",
        "redis://h:6379?db=1&username=admin&password=pw-1",
    ],
)
def test_redact_drops_every_credential_redis_py_would_use(url: str) -> None:
    parsed = parse_url(url.split("#")[0])
    out = redact(url)
    for secret in ("pw-1", "pw-2", "p@ss", "p%40w", "/secret/k.pem", "admin", "user:", "u:"):
        assert secret not in out
    again = parse_url(out.replace("***", "x"))
    for keep in ("host", "port", "db", "path"):
        assert again.get(keep) == parsed.get(keep), keep
    assert "password" not in again or again["password"] == "x"


def test_redact_of_an_unparseable_url_says_nothing_of_it() -> None:
    assert redact("redis://:pw-1@[::1") == "redis://***"


@pytest.mark.parametrize(
    "shape", ["user-pass", "colon-pass", "raw-at", "query", "query-user", "unix-userinfo",
              "unix-query"],
)  # fmt: skip
def test_restore_writes_and_prints_only_the_redacted_url(
    shape: str, server: tuple[int, str], run_fxcache: RunFxcache, tmp_path: Path
) -> None:
    url, password = _shapes(*server)[shape]
    state_path = tmp_path / "state.json"
    proc = run_fxcache(
        "restore", "--root", str(tmp_path / "root"), "--python", TORCH_PYTHON, "--json",
        "--store", "redis", "--redis-url", url, "--state-file", str(state_path),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    state = json.loads(proc.stdout)
    assert state["redis"]["reachable"] is True, state["redis"]  # the password was right
    assert state["redis"]["url"] == redact(url)
    for where, text in (
        ("stdout", proc.stdout),
        ("stderr", proc.stderr),
        ("state file", state_path.read_text()),
    ):
        assert _leaks(text, password) == [], where


def test_an_unreachable_redis_warning_carries_no_password(
    run_fxcache: RunFxcache, tmp_path: Path
) -> None:
    url = f"redis://:{SIMPLE}@127.0.0.1:{free_port()}/0?password={SIMPLE}"
    proc = run_fxcache(
        "restore", "--root", str(tmp_path / "root"), "--python", TORCH_PYTHON, "--json",
        "--store", "redis", "--redis-url", url, "--state-file", str(tmp_path / "s.json"),
        env={"GITHUB_ACTIONS": "true"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "unreachable" in proc.stderr
    assert _leaks(proc.stdout + proc.stderr + (tmp_path / "s.json").read_text(), SIMPLE) == []
