"""`--store redis` and `fxcache invalidate --redis` against a real redis-server."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.conftest import TORCH_PYTHON, RunFxcache, free_port
from tests.store_helpers import Store

# A database of our own on the shared server: other tests' pt2: keys live in db 0.
DB = 7


@pytest.fixture
def url(redis_url: str) -> str:
    return redis_url.rsplit("/", 1)[0] + f"/{DB}"


@pytest.fixture
def store(tmp_path: Path, run_fxcache: RunFxcache) -> Store:
    return Store(root=tmp_path / "root", run=run_fxcache, env={})


def _exports(stdout: str) -> dict[str, str]:
    out = subprocess.run(
        ["bash", "-c", stdout + "env"], capture_output=True, text=True, check=True
    ).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def test_restore_configures_torch_remote_caches(store: Store, url: str, tmp_path: Path) -> None:
    proc = store.run(
        "restore", "--root", str(store.root), "--python", TORCH_PYTHON, "--store", "redis",
        "--state-file", str(tmp_path / "s.json"), env={"FXCACHE_REDIS_URL": url},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    env = _exports(proc.stdout)
    assert env["TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE"] == "1"
    assert env["TORCHINDUCTOR_AUTOTUNE_REMOTE_CACHE"] == "1"
    assert env["TORCHINDUCTOR_REDIS_URL"] == url
    assert env["TORCHINDUCTOR_CACHE_DIR"].endswith("/inductor")  # local store stays level one
    state = json.loads((tmp_path / "s.json").read_text())
    assert state["store"] == "redis" and state["redis"] == {"url": url, "reachable": True}


@pytest.fixture
def silent_server() -> Iterator[str]:
    """A TCP server that accepts connections and never answers (a hung Redis)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        sock.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(sock.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"redis://127.0.0.1:{sock.getsockname()[1]}/0"
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    sock.close()


@pytest.mark.parametrize("kind", ["refused", "hung"])
def test_unreachable_redis_is_a_warning_and_local_only(
    store: Store, tmp_path: Path, kind: str, request: pytest.FixtureRequest
) -> None:
    url = (
        f"redis://127.0.0.1:{free_port()}/0"
        if kind == "refused"
        else request.getfixturevalue("silent_server")
    )
    state = store.restore("--store", "redis", "--redis-url", url, env={"GITHUB_ACTIONS": "true"})
    assert state["redis"]["reachable"] is False and state["redis"]["error"]
    assert "::warning::fxcache: Redis at" in state["_stderr"]
    assert "continuing with the local store only" in state["_stderr"]
    assert Path(state["inductor_dir"]).is_dir()


def _restore_idle(client: redis.Redis, keys: list[str], idle_s: int) -> None:
    """Create `keys` already idle for `idle_s` (RESTORE ... IDLETIME sets a key's idle time
    exactly: no sleeping, no timing assumptions)."""
    client.set("template", b"x" * 10)
    payload = client.dump("template")
    client.delete("template")
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.restore(key, 0, payload, idletime=idle_s)
    pipe.execute()


class _RepeatingScan:
    """A real client whose SCAN returns every batch's keys again in the next one (and the
    first key twice in a batch): Redis documents that SCAN may return a key more than once."""

    def __init__(self, client: redis.Redis) -> None:
        self._client = client
        self._last: list[bytes] = []

    def scan(self, **kwargs: object) -> tuple[int, list[bytes]]:
        cursor, keys = self._client.scan(**kwargs)  # type: ignore[arg-type]
        out = [*self._last, *keys, *keys[:1]]
        self._last = list(keys)
        return cursor, out

    def __getattr__(self, name: str) -> object:
        return getattr(self._client, name)


def test_invalidate_redis_counts_and_removes_each_key_once_when_scan_repeats_keys(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ci_fxcache.store.remote import redis_cache

    client = redis.Redis.from_url(url)
    client.flushdb()
    _restore_idle(client, [f"pt2:fx-graph-v1::old{i}:c1" for i in range(30)], 3 * 86400)
    client.set("pt2:fx-graph-v1::fresh:c1", b"y")
    monkeypatch.setattr(redis_cache, "_client", lambda u: _RepeatingScan(redis.Redis.from_url(u)))
    dry = redis_cache.expire_idle(url, 2 * 86400, dry_run=True, batch=7)
    assert (dry["scanned"], dry["would_remove"], dry["removed"]) == (31, 30, 0)
    assert dry["bytes"] > 0 and client.dbsize() == 31
    real = redis_cache.expire_idle(url, 2 * 86400, dry_run=False, batch=7)
    assert (real["scanned"], real["would_remove"], real["removed"]) == (31, 30, 30)
    assert real["bytes"] == dry["bytes"]
    assert client.keys() == [b"pt2:fx-graph-v1::fresh:c1"]


def test_redis_store_without_a_url_runs_local_only_with_a_notice(store: Store) -> None:
    """The one fallback rule (factory.store_policy, as the action's): no address, local only;
    a malformed one is a usage error."""
    state = store.restore("--store", "redis")
    assert state["store"] == "local" and state["redis"] is None, state
    assert "store redis without a redis-url" in state["_stderr"]
    proc = store.run("restore", "--root", str(store.root), "--store", "redis",
                     "--redis-url", "http://not-redis")  # fmt: skip
    assert proc.returncode == 2 and "--redis-url" in proc.stderr


def test_invalidate_redis_removes_only_idle_pt2_keys(store: Store, url: str) -> None:
    client = redis.Redis.from_url(url)
    client.flushdb()
    idle = [f"pt2:fx-graph-v1::old{i}:c1" for i in range(1200)]  # more than one SCAN batch
    _restore_idle(client, [*idle, "other:app:key"], 3 * 86400)
    client.set("pt2:fx-graph-v1::fresh:c1", b"y")
    client.get(idle[0])  # a read makes a key fresh again
    base = ["invalidate", "--redis", "--max-age", "2d", "--json"]
    dry = store.run(*base, "--dry-run", env={"FXCACHE_REDIS_URL": url})
    assert dry.returncode == 0, dry.stderr
    report = json.loads(dry.stdout)["redis"]
    assert report["scanned"] == 1201 and report["would_remove"] == 1199
    assert report["removed"] == 0 and client.dbsize() == 1202
    proc = store.run(*base, "--redis-url", url)
    assert json.loads(proc.stdout)["redis"]["removed"] == 1199
    assert sorted(client.keys()) == [  # KEYS names each key once; SCAN may repeat one
        b"other:app:key",
        b"pt2:fx-graph-v1::fresh:c1",
        idle[0].encode(),
    ]
    table = store.run("invalidate", "--redis", "--max-age", "1d", "--redis-url", url)
    assert "scanned 2 pt2: keys, removed 0 idle ones" in table.stdout


def test_invalidate_redis_unreachable_is_a_failed_check_never_a_usage_error(store: Store) -> None:
    """Issue 39: a network failure is exit 1 (the scheduled job's input was fine), one line."""
    with socket.socket() as held:  # bound, never listening: connections are refused
        held.bind(("127.0.0.1", 0))
        port = held.getsockname()[1]
        proc = store.run(
            "invalidate", "--redis", "--max-age", "1d", "--redis-url", f"redis://127.0.0.1:{port}/0"
        )
    assert proc.returncode == 1, proc.stderr
    assert f"Redis at redis://127.0.0.1:{port}/0" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_invalidate_redis_needs_max_age(store: Store, url: str) -> None:
    proc = store.run("invalidate", "--redis", "--keep-latest", "1", "--redis-url", url)
    assert proc.returncode == 2 and "needs --max-age" in proc.stderr


COMPILE = """
import torch
def f(x, y):
    return (x.sin() @ y).relu()
torch.compile(f)(torch.randn(8, 8), torch.randn(8, 8))
from torch._dynamo.utils import counters
print("COUNTERS", dict(counters["inductor"]))
"""


@pytest.mark.slow
def test_torch_writes_through_redis_under_the_pt2_prefix(
    store: Store, url: str, tmp_path: Path
) -> None:
    """A real compile with the environment restore exported: torch's entries land in Redis
    under the prefix `invalidate --redis` scans."""
    client = redis.Redis.from_url(url)
    client.flushdb()
    proc = store.run(
        "restore", "--root", str(store.root), "--python", TORCH_PYTHON, "--store", "redis",
        "--redis-url", url, "--state-file", str(tmp_path / "s.json"),
    )  # fmt: skip
    env = {**os.environ, **_exports(proc.stdout), "TORCHINDUCTOR_COMPILE_THREADS": "1"}
    run = subprocess.run(
        [sys.executable, "-c", COMPILE], env=env, capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0, run.stderr[-2000:]
    keys = [k.decode() for k in client.keys("*")]
    assert keys and all(k.startswith("pt2:") for k in keys), keys
    assert any("fx-graph" in k for k in keys), keys
    proc = store.run("invalidate", "--redis", "--max-age", "1d", "--json", "--redis-url", url)
    assert json.loads(proc.stdout)["redis"]["scanned"] == len(keys)
