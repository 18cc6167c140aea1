"""`fxcache invalidate --github --keep-latest` keeps N per runner pool, read from keys alone."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime, timedelta

from ci_fxcache.env import scopekey
from ci_fxcache.env.gpus import Gpu
from tests.conftest import RunFxcache
from tests.fake_github import FakeGitHub
from tests.test_scopekey import SM90


def _ago(days: float) -> str:
    return (datetime.now(UTC) - timedelta(days=days)).strftime("%Y-%m-%dT%H:%M:%S.000Z")


def _key(name: str, run: int, **changes: str) -> str:
    fp = dataclasses.replace(SM90, gpus=(Gpu(0, name, "9.0", "sm90"),), **changes)
    return scopekey.scope_key(fp, f"run{run}.1")


def test_one_shared_store_keeps_the_latest_of_each_gpu_model(
    fake_github: FakeGitHub, run_fxcache: RunFxcache
) -> None:
    h100, h200 = "NVIDIA H100 80GB HBM3", "NVIDIA H200"
    legacy = "fxcache-v1-linux-x86_64-cp312-torch2.13.0+cu128-cu12.8-sm90-{:012x}-run{}.1"
    caches = {
        "h100 today": (_key(h100, 30), 0.1),
        "h100 yesterday": (_key(h100, 20), 1),
        "h100 old torch": (_key(h100, 10, torch_version="2.13.0+cu130"), 5),
        "h200": (_key(h200, 25), 3),  # older than every H100 save, the only H200 one
        "legacy a": (legacy.format(1, 5), 0.5),  # written by an fxcache before pools
        "legacy b": (legacy.format(2, 4), 6),
        "foreign": ("Linux-pip-deadbeef", 90),
    }
    ids = {
        label: fake_github.add_cache(key, last_accessed_at=_ago(days))["id"]
        for label, (key, days) in caches.items()
    }
    proc = run_fxcache(
        "invalidate", "--github", "--keep-latest", "1", "--json", env=fake_github.env()
    )
    assert proc.returncode == 0, proc.stderr
    removed = {row["id"] for row in json.loads(proc.stdout)["rows"]}
    assert removed == {ids["h100 yesterday"], ids["h100 old torch"], ids["legacy b"]}
    left = {c["id"] for c in fake_github.caches}
    assert {ids["h100 today"], ids["h200"], ids["legacy a"], ids["foreign"]} <= left
