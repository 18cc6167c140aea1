"""A full verification (a signing key's) right after a fetch of the same process stats what
the fetch wrote instead of hashing every file again (store.seal.Fresh), and still finds any
change made in between: a file rewritten with its size and mtime put back, truncated,
replaced, a file planted beside them, a manifest swapped. On obstore's in-memory store (the
fetch is the object-store tier's), in-process, as `fxcache restore` composes them
(store.tiered.restore: the fetch, then the local restore)."""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ci_fxcache.env import fingerprint
from ci_fxcache.store import manifest as mf
from ci_fxcache.store import restore as store_restore
from ci_fxcache.store import seal
from ci_fxcache.store.layout import Layout
from ci_fxcache.store.remote import transfer
from ci_fxcache.store.remote.s3 import client
from ci_fxcache.store.remote.s3.tier import S3Tier
from tests.conftest import TORCH_PYTHON
from tests.store_helpers import committed_scope

obstore_store = pytest.importorskip("obstore.store")

KEY = "fresh-fetch-signing-key-0123456789abcdef"
SCOPE = "fxcache-v1-linux-x86_64-cp311-torch2.13.0+cpu-cpu-59b2e5fecf37"
FILES = {
    **{f"inductor/fxgraph/a{i}/entry": f"graph {i} ".encode() * (40 + i) for i in range(5)},
    "triton/K1/kernel.cubin": os.urandom(4096),
}
TARGET = "inductor/fxgraph/a2/entry"


@pytest.fixture(scope="module")
def fp() -> fingerprint.Fingerprint:
    return fingerprint.collect(TORCH_PYTHON)


@pytest.fixture
def bucket(tmp_path: Path) -> S3Tier:
    """A bucket holding scope SCOPE with FILES, published signed by a first runner."""
    memory = obstore_store.MemoryStore()
    where = client.parse_url("s3://memory-bucket/fleet/ci")
    root = tmp_path / "first"
    committed = committed_scope(root, SCOPE, FILES, KEY)
    tier = S3Tier(where, client.Bucket(where, store=memory))
    published = tier.publish(Layout(root), SCOPE, committed, KEY)
    assert published.published, published
    return S3Tier(where, client.Bucket(where, store=memory))


def _fetched(bucket: S3Tier, root: Path) -> tuple[Layout, seal.Fresh]:
    """An empty runner's fetch into `root`: the layout and what the fetch vouches for."""
    layout = Layout(root)
    info, written = transfer.fetch_scope(layout, SCOPE, bucket, signing_key=KEY)
    assert info["fetched"] and written is not None, info
    return layout, written


def _hashes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every file the local restore hashes from now on (mf.sha256_file's calls)."""
    seen: list[str] = []
    real = mf.sha256_file

    def counting(path: Path) -> str:
        seen.append(str(path))
        return real(path)

    monkeypatch.setattr(mf, "sha256_file", counting)
    return seen


def _restore(layout: Layout, fp: fingerprint.Fingerprint, written: seal.Fresh | None) -> Any:
    options = store_restore.Options(signing_key=KEY, full_verify=True)
    return store_restore.restore(layout, SCOPE, fp, options, written)


def _served(state: Any) -> dict[str, bytes]:
    base = state.inductor_dir.parent
    return {
        p.relative_to(base).as_posix(): p.read_bytes()
        for top in ("inductor", "triton")
        for p in sorted((base / top).rglob("*"))
        if p.is_file()
    }


def test_a_keyed_restore_right_after_the_fetch_hashes_no_file_again(
    tmp_path: Path, bucket: S3Tier, fp: fingerprint.Fingerprint, monkeypatch: pytest.MonkeyPatch
) -> None:
    layout, written = _fetched(bucket, tmp_path / "b")
    hashed = _hashes(monkeypatch)
    state = _restore(layout, fp, written)
    assert state.hit and state.verify_mode == "full" and state.signed, state
    assert _served(state) == FILES
    assert hashed == []  # the fetch checked every byte as it wrote it


def test_without_what_the_fetch_vouches_for_every_file_is_hashed_again(
    tmp_path: Path, bucket: S3Tier, fp: fingerprint.Fingerprint, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The counter above sees hashing: the same restore without the fetch's record (a later
    job on this runner) hashes every file."""
    layout, _written = _fetched(bucket, tmp_path / "b")
    hashed = _hashes(monkeypatch)
    state = _restore(layout, fp, None)
    assert state.hit and state.verify_mode == "full"
    assert len(hashed) == len(FILES), hashed


def _rewrite_keeping_size_and_mtime(path: Path) -> None:
    st = path.stat()
    path.chmod(0o644)
    path.write_bytes(b"X" * st.st_size)
    path.chmod(0o444)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def _truncate(path: Path) -> None:
    path.chmod(0o644)
    with path.open("r+b") as f:
        f.truncate(3)


def _replace(path: Path) -> None:
    """Another file renamed over it (a new inode), with the same size and mtime."""
    st = path.stat()
    other = path.with_name("other")
    other.write_bytes(b"Y" * st.st_size)
    os.utime(other, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.replace(other, path)


TAMPERS: dict[str, tuple[Callable[[Path], None], str]] = {
    "rewritten, size and mtime put back": (_rewrite_keeping_size_and_mtime, "altered"),
    "truncated": (_truncate, "truncated"),
    "replaced by rename": (_replace, "altered"),
}


@pytest.mark.parametrize("tamper", sorted(TAMPERS))
def test_a_file_changed_between_the_fetch_and_the_check_quarantines_the_scope(
    tmp_path: Path, bucket: S3Tier, fp: fingerprint.Fingerprint, tamper: str
) -> None:
    layout, written = _fetched(bucket, tmp_path / "b")
    change, kind = TAMPERS[tamper]
    time.sleep(0.05)  # past the coarse clock's tick in which the fetch wrote (seal.Fresh)
    change(layout.scope(SCOPE) / TARGET)
    state = _restore(layout, fp, written)
    assert not state.hit and state.quarantined, state
    assert kind in state.quarantined[0]["reason"], state.quarantined
    assert any(TARGET in line for line in state.quarantined[0]["problems"])


def test_a_file_planted_after_the_fetch_is_set_aside_never_served(
    tmp_path: Path, bucket: S3Tier, fp: fingerprint.Fingerprint
) -> None:
    layout, written = _fetched(bucket, tmp_path / "b")
    time.sleep(0.05)
    planted = layout.scope(SCOPE) / "inductor/fxgraph/a1/planted"
    planted.write_bytes(b"never saved")
    state = _restore(layout, fp, written)
    assert state.hit and state.set_aside and state.set_aside["files"] == 1, state
    assert not planted.exists() and _served(state) == FILES


def test_a_manifest_swapped_after_the_fetch_is_checked_in_full(
    tmp_path: Path, bucket: S3Tier, fp: fingerprint.Fingerprint, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The record holds for the manifest the fetch wrote only: another one (here the same
    files re-signed in another order of keys, so valid) sends the check back to hashing."""
    layout, written = _fetched(bucket, tmp_path / "b")
    path = layout.manifest(SCOPE)
    manifest = mf.parse(path.read_bytes())
    path.chmod(0o644)
    path.write_text(mf.Committed.of(manifest).text + "\n")
    assert hashlib.sha256(path.read_bytes()).hexdigest() != written.manifest_sha256
    hashed = _hashes(monkeypatch)
    state = _restore(layout, fp, written)
    assert state.hit and len(hashed) == len(FILES), hashed
