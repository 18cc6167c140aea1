"""Versions of a workload beyond those a run compares are pruned at save (issue 47).

Each merged edit of a model (a comment too) records a new reference beside the committed ones,
with its own copy of the combination's caches; a hot-only run compares only the newest
`MAX_COMPARED`. The save drops the older ones from the manifest and the disk, so a scope does
not grow with each edit, and the next restore finds the scope whole.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ci_fxcache.store import references
from ci_fxcache.verify import versions
from tests.conftest import RunFxcache
from tests.store_helpers import Store

COMBO = "verify/fxgraph-cpu-float32-static-infer"


@pytest.fixture
def store(tmp_path: Path, run_fxcache: RunFxcache) -> Store:
    return Store(root=tmp_path / "root", run=run_fxcache, env={})


def _record(directory: Path, created: str) -> None:
    """A reference as a cold phase records one, with a cache file of its own."""
    (directory / "inductor" / "ab").mkdir(parents=True)
    (directory / "inductor" / "ab" / "entry").write_bytes(created.encode() * 100)
    (directory / "reference.pt").write_bytes(b"tensors " + created.encode())
    (directory / "reference.json").write_text(json.dumps({"created_at": created}))


def _version(base: Path, n: int) -> Path:
    return base / versions.VERSIONS / f"2026120{n}T000000Z-{n:08x}"


def _listed(scope: Path) -> set[str]:
    return set(json.loads((scope / "manifest.json").read_text())["files"])


def test_versions_beyond_those_compared_are_pruned_at_save(store: Store) -> None:
    state = store.restore()
    scope = Path(state["scope_dir"])
    base = scope / COMBO
    _record(base, "2026-12-01T00:00:00Z")  # the oldest: the combination's own directory
    for n in range(1, 9):
        _record(_version(base, n), f"2026-12-0{n}T01:00:00Z")
    saved = json.loads(store.save().stdout)
    assert saved["saved"] and saved["pruned_references"] == 1, saved
    # nine recorded, eight compared: the base's own files are gone, its versions stay
    assert versions.recorded(base) == [_version(base, n) for n in range(8, 0, -1)]
    assert not (base / "reference.json").exists() and not (base / "inductor").exists()
    listed = _listed(scope)
    assert not any(rel.startswith(f"{COMBO}/reference") for rel in listed)
    assert f"{COMBO}/{versions.VERSIONS}/{_version(base, 1).name}/reference.pt" in listed

    state = store.restore()  # the scope is whole: nothing the manifest lists is missing
    assert state["hit"] is True and state["quarantined"] == [], state["_stderr"]
    newest = base / versions.VERSIONS / "20261209T000000Z-00000009"
    _record(newest, "2026-12-09T01:00:00Z")
    saved = json.loads(store.save().stdout)
    assert saved["pruned_references"] == 1, saved
    found = versions.recorded(base)
    assert len(found) == references.MAX_COMPARED and found[0] == newest
    assert not _version(base, 1).exists()  # the oldest version, files and directory
    assert all(_version(base, 1).name not in rel for rel in _listed(scope))
    assert references.newest_first(base) == found  # nothing beyond is left on disk
    state = store.restore()
    assert state["hit"] is True and state["quarantined"] == [], state["_stderr"]


def test_a_scope_with_few_versions_prunes_nothing(store: Store) -> None:
    state = store.restore()
    base = Path(state["scope_dir"]) / COMBO
    _record(base, "2026-12-01T00:00:00Z")
    _record(_version(base, 1), "2026-12-01T01:00:00Z")
    saved = json.loads(store.save().stdout)
    assert saved["saved"] and "pruned_references" not in saved, saved
    assert len(versions.recorded(base)) == 2
