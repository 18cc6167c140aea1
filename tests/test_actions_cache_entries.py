"""Issue 26 §6: `store: github` entries: restored files keep the local store's modes, and the
prefix lookup never serves another key suffix's entry (against tests/fake_cache_service.py)."""

from __future__ import annotations

import json
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from ci_fxcache.store import actions_cache as ac
from tests.conftest import RunFxcache
from tests.fake_cache_service import FakeCacheService
from tests.store_helpers import SAMPLE, Store, write_files

SCOPE = "fxcache-v1-linux-x86_64-cp311-torch2.13.0+cpu-cpu-0123456789ab"


@pytest.fixture
def fake() -> Iterator[FakeCacheService]:
    with FakeCacheService() as server:
        yield server


def _service(fake: FakeCacheService) -> ac.CacheService:
    where, problem = ac.runtime(fake.env())
    assert where is not None, problem
    return ac.CacheService(where, max_attempts=2, sleep=lambda s: None)


def _scope(root: Path, payload: bytes) -> Path:
    scope = root / SCOPE
    write_files(scope, {"inductor/fx/graph.bin": payload, "manifest.json": b"{}"})
    return scope


def _modes(root: Path) -> dict[str, int]:
    return {
        p.relative_to(root).as_posix(): stat.S_IMODE(p.lstat().st_mode)
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_an_archive_restore_keeps_committed_files_read_only(
    tmp_path: Path, fake: FakeCacheService, run_fxcache: RunFxcache
) -> None:
    store = Store(root=tmp_path / "root", run=run_fxcache, env={})
    state = store.restore()
    write_files(state["scope_dir"], SAMPLE)
    proc = store.save()
    assert proc.returncode == 0 and json.loads(proc.stdout)["saved"], proc.stderr
    scope = Path(state["scope_dir"])
    local = _modes(scope)
    assert {local[rel] for rel in SAMPLE} == {0o444}  # what the local store commits
    service = _service(fake)
    assert ac.save_directory(service, scope, f"{scope.name}-run1.1")["uploaded"]
    target = tmp_path / "runner-2" / scope.name
    assert ac.restore_directory(service, target, f"{scope.name}-run2.1", [f"{scope.name}-"])
    assert _modes(target) == local


def test_the_unsuffixed_prefix_never_restores_a_suffixed_entry(
    tmp_path: Path, fake: FakeCacheService
) -> None:
    service = _service(fake)
    ac.save_directory(service, _scope(tmp_path / "a", b"ours"), f"{SCOPE}-run1.1")
    ac.save_directory(service, _scope(tmp_path / "b", b"modelB"), f"{SCOPE}-modelB-run2.1")
    target = tmp_path / "r" / SCOPE
    with pytest.raises(ac.CacheServiceError, match="longer key suffix"):
        ac.restore_directory(service, target, f"{SCOPE}-run3.1", [f"{SCOPE}-"])
    assert not target.exists()  # a cold start, never modelB's graphs
    assert fake.violations == []


def test_a_suffixed_prefix_never_restores_a_longer_suffix_or_no_suffix(
    tmp_path: Path, fake: FakeCacheService
) -> None:
    service = _service(fake)
    ac.save_directory(service, _scope(tmp_path / "a", b"plain"), f"{SCOPE}-run1.1")
    prefix = f"{SCOPE}-modelB-"
    assert (
        ac.restore_directory(service, tmp_path / "r1" / SCOPE, f"{prefix}run5.1", [prefix]) is None
    )
    ac.save_directory(service, _scope(tmp_path / "b", b"mine"), f"{prefix}run2.1")
    ac.save_directory(service, _scope(tmp_path / "c", b"longer"), f"{SCOPE}-modelB-x-run3.1")
    with pytest.raises(ac.CacheServiceError, match="longer key suffix"):
        ac.restore_directory(service, tmp_path / "r2" / SCOPE, f"{prefix}run5.1", [prefix])
    ac.save_directory(service, _scope(tmp_path / "d", b"mine, newer"), f"{prefix}run4.1")
    target = tmp_path / "r3" / SCOPE
    assert ac.restore_directory(service, target, f"{prefix}run5.1", [prefix]) == f"{prefix}run4.1"
    assert (target / "inductor/fx/graph.bin").read_bytes() == b"mine, newer"


@pytest.mark.parametrize(
    "matched, ok",
    [
        (f"{SCOPE}-run12.3", True),
        (f"{SCOPE}-modelB-run12.3", False),
        (f"{SCOPE}-run1.1-run12.3", False),  # the suffix 'run1.1'
        (f"{SCOPE}-run12", False),
        (f"{SCOPE}-run12.3x", False),
    ],
)
def test_entry_of(matched: str, ok: bool) -> None:
    assert ac.entry_of(matched, f"{SCOPE}-run99.1", [f"{SCOPE}-"]) is ok
    assert ac.entry_of(ac.entry_key(f"{SCOPE}-", "7", "2"), "k", [f"{SCOPE}-"])
