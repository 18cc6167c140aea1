"""`fxcache invalidate`: one call shape for every store (store/invalidate.py), built by the
factory; a store that cannot be reached is exit 1, never 2; the local store's two trust
namespaces both cleaned, each by the policies on its own."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ci_fxcache.action import inputs as action_inputs
from ci_fxcache.store.invalidate import LocalStore
from ci_fxcache.store.layout import REMOTE_READERS
from ci_fxcache.store.remote import factory, redis_cache
from ci_fxcache.store.remote.factory import StoreChoice
from ci_fxcache.store.remote.github.invalidate import ActionsCaches
from ci_fxcache.store.remote.s3.invalidate import Bucket
from tests.conftest import RunFxcache
from tests.fake_github import FakeGitHub
from tests.runner_sim import run_event
from tests.store_helpers import write_files

KEY = "fxcache-v1-linux-x86_64-cp311-torch2.13.0-cu12.8-sm90-{:012x}"


@pytest.fixture
def refused_port() -> Iterator[int]:
    """A loopback port that refuses connections: bound, never listening (a stopped server)."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        yield held.getsockname()[1]


def test_the_factory_builds_every_kind_with_one_call_shape(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:9")
    built = {
        kind: factory.invalidator_for(
            StoreChoice(kind=kind, url=url), root=tmp_path, gc_grace_s=86400.0
        )
        for kind, url in (
            ("local", None),
            ("s3", "s3://bucket/prefix"),
            ("github", None),
            ("redis", "redis://127.0.0.1:6379/0"),
        )
    }
    assert [type(b) for b in built.values()] == [
        LocalStore,
        Bucket,
        ActionsCaches,
        redis_cache.IdleKeys,
    ]
    assert all(callable(getattr(b, "invalidate", None)) for b in built.values())


def test_an_unreachable_s3_endpoint_is_exit_1(
    tmp_path: Path, run_fxcache: RunFxcache, refused_port: int
) -> None:
    """Issue 39: a network failure is a failed check (the scheduled job's input was fine)."""
    env = {
        "FXCACHE_S3_URL": "s3://fleet-cache/ci",
        "AWS_ENDPOINT_URL_S3": f"http://127.0.0.1:{refused_port}",
        "AWS_ACCESS_KEY_ID": "K",
        "AWS_SECRET_ACCESS_KEY": "S",
        "AWS_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
        "FXCACHE_S3_DEADLINE": "2",
    }
    proc = run_fxcache("invalidate", "--s3", "--max-age", "14d", "--json", env=env)
    assert proc.returncode == 1, (proc.returncode, proc.stderr)
    assert "S3 s3://fleet-cache/ci" in proc.stderr and proc.stdout == "", proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_a_github_api_that_is_down_is_exit_1(
    fake_github: FakeGitHub, run_fxcache: RunFxcache, refused_port: int
) -> None:
    """The client retries (about 15 s of backoff), then the run fails as a check, not usage."""
    env = {**fake_github.env(), "GITHUB_API_URL": f"http://127.0.0.1:{refused_port}"}
    proc = run_fxcache("invalidate", "--github", "--max-age", "14d", env=env)
    assert proc.returncode == 1, (proc.returncode, proc.stderr)
    assert "actions/caches -> no answer" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def _plant(root: Path, digits: int, days: float) -> Path:
    """A scope of our key format in `root`, last used `days` ago."""
    scope = root / KEY.format(digits)
    write_files(scope, {"inductor/x/blob": b"z" * 100})
    (scope / "manifest.json").write_text(json.dumps({"scope_key": scope.name, "files": {}}))
    then = time.time() - days * 86400
    os.utime(scope / "manifest.json", (then, then))
    return scope


def test_local_invalidate_cleans_both_trust_namespaces(
    tmp_path: Path, run_fxcache: RunFxcache
) -> None:
    root = tmp_path / "store"
    readers = root / REMOTE_READERS
    old, fresh = _plant(root, 1, 30), _plant(root, 2, 1)
    old_read, fresh_read = _plant(readers, 3, 30), _plant(readers, 4, 1)
    proc = run_fxcache("invalidate", "--root", str(root), "--max-age", "14d", "--json")
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)["rows"]
    assert sorted((r["scope"], r["action"]) for r in rows) == [
        (f"{REMOTE_READERS}/{old_read.name}", "removed"),
        (old.name, "removed"),
    ]
    assert not old.exists() and not old_read.exists()
    assert fresh.exists() and fresh_read.exists()
    # The namespace given as the root is one root: nothing nested is looked for.
    again = run_fxcache("invalidate", "--root", str(readers), "--max-age", "0s", "--json")
    assert [r["scope"] for r in json.loads(again.stdout)["rows"]] == [fresh_read.name]


def test_each_namespace_keeps_its_own_latest(tmp_path: Path, run_fxcache: RunFxcache) -> None:
    """Scopes that read-only runs committed never push a trusted run's scope out."""
    root = tmp_path / "store"
    trusted = _plant(root, 1, 5)
    newer_read = [_plant(root / REMOTE_READERS, d, 1) for d in (2, 3)]
    proc = run_fxcache("invalidate", "--root", str(root), "--keep-latest", "1", "--json")
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)["rows"]
    assert [r["scope"] for r in rows] == [f"{REMOTE_READERS}/{newer_read[0].name}"]
    assert trusted.exists() and newer_read[1].exists() and not newer_read[0].exists()


def invalidate_step(
    tmp_path: Path, extra_env: dict[str, str] | None = None, **inputs: str
) -> subprocess.CompletedProcess[str]:
    """The invalidate sub-action's step (`fxcache action invalidate`), as the runner starts it
    (`extra_env`: the cloud's variables a job sets)."""
    values = {i.name: "" for i in action_inputs.INVALIDATE}
    event = run_event("schedule", {"schedule": "0 3 * * *"})
    values.update({"python": sys.executable, "dry-run": "false", "run-event": event})
    values.update(inputs)
    for name in ("github-output", "summary"):
        (tmp_path / name).write_text("")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "FXCACHE_"))}
    env.update(
        GITHUB_ACTIONS="true",
        GITHUB_OUTPUT=str(tmp_path / "github-output"),
        GITHUB_STEP_SUMMARY=str(tmp_path / "summary"),
        GITHUB_EVENT_NAME="schedule",
        RUNNER_TEMP=str(tmp_path / "runner-temp"),
        FXCACHE_INPUTS=json.dumps(values),
    )
    env.update(extra_env or {})
    return subprocess.run(
        [sys.executable, "-m", "ci_fxcache", "action", "invalidate"],
        env=env, capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip


def test_the_invalidate_sub_action_makes_the_same_typed_call(tmp_path: Path) -> None:
    root = tmp_path / "store"
    old, old_read = _plant(root, 1, 30), _plant(root / REMOTE_READERS, 2, 30)
    step = invalidate_step(tmp_path, **{"cache-root": str(root), "max-age": "14d",
                                         "target": "local"})  # fmt: skip
    assert step.returncode == 0, step.stderr
    printed = json.loads(step.stdout)
    kept = tmp_path / "runner-temp" / "fxcache" / "invalidate-local.json"
    assert json.loads(kept.read_text()) == printed
    output = (tmp_path / "github-output").read_text().splitlines()
    assert output[0].startswith("report-json<<") and output[1] == str(kept)
    assert sorted(r["scope"] for r in printed["rows"]) == [
        f"{REMOTE_READERS}/{old_read.name}",
        old.name,
    ]
    assert "## fxcache invalidate" in (tmp_path / "summary").read_text()


def test_the_invalidate_sub_action_passes_the_redis_url_it_was_given(
    tmp_path: Path, refused_port: int
) -> None:
    """The URL is an argument (no variable set for the toolkit to find): Redis down is exit 1."""
    url = f"redis://127.0.0.1:{refused_port}/0"
    step = invalidate_step(tmp_path, **{"redis-url": url, "max-age": "1d", "target": "redis"})
    assert step.returncode == 1, step.stderr
    assert f"Redis at {url}" in step.stderr and "Traceback" not in step.stderr
