"""The toolkit's own client of the Actions cache service v2
(ci_fxcache/store/remote/github/cache_service.py) against the strict fake
(tests/fake_cache_service.py)."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import zstandard

from ci_fxcache.store import manifest as mf
from ci_fxcache.store.remote.github import archive
from ci_fxcache.store.remote.github import cache_service as ac
from tests.conftest import RunFxcache
from tests.fake_cache_service import FakeCacheService
from tests.store_helpers import SAMPLE, Store, write_files


@pytest.fixture
def fake() -> Iterator[FakeCacheService]:
    with FakeCacheService() as server:
        yield server


def _service(fake: FakeCacheService) -> ac.CacheService:
    where, problem = ac.runtime(fake.env())
    assert where is not None, problem
    return ac.CacheService(where, max_attempts=2, sleep=lambda s: None)


def _committed(scope: Path, files: dict[str, bytes], **extra: str) -> Path:
    """A committed scope as the local store leaves it: the files read-only, and a manifest
    listing each (size, mtime, sha256); `extra` files are there but never committed."""
    listed: dict[str, Any] = {}
    for rel, data in files.items():
        path = scope / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        path.chmod(0o444)
        listed[rel] = {"size": len(data), "mtime_ns": path.stat().st_mtime_ns,
                       "sha256": hashlib.sha256(data).hexdigest()}  # fmt: skip
    for rel, text in extra.items():
        (scope / rel).parent.mkdir(parents=True, exist_ok=True)
        (scope / rel).write_text(text)
    manifest = {
        "schema": mf.SCHEMA, "scope_key": scope.name, "fingerprint": {}, "torch_paths": [],
        "created_at": "2026-12-02T00:00:00Z", "updated_at": "2026-12-02T00:00:00Z",
        "last_used_at": "2026-12-02T00:00:00Z", "verification": {"references": []},
        "files": listed, "total_bytes": sum(len(d) for d in files.values()),
    }  # fmt: skip
    mf.write_atomic(scope / "manifest.json", manifest, scope.parent)
    return scope


def _scope(root: Path, payload: bytes = b"kernel") -> Path:
    return _committed(root / "fxcache-v1-linux-x", {"inductor/fx/graph.bin": payload,
                                                     "inductor/fx/empty": b""})  # fmt: skip


def _tree(root: Path) -> dict[str, bytes | str]:
    out: dict[str, bytes | str] = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        if path.is_symlink():
            out[rel] = "-> " + os.readlink(path)
        elif path.is_file():
            out[rel] = path.read_bytes()
    return out


def test_save_then_restore_by_prefix(tmp_path: Path, fake: FakeCacheService) -> None:
    scope = _scope(tmp_path / "a")
    service = _service(fake)
    sent = ac.save_directory(service, scope, "fxcache-v1-linux-x-run1.1")
    assert sent["uploaded"] and sent["bytes"] > 0, sent
    [entry] = fake.committed()
    assert entry.key == "fxcache-v1-linux-x-run1.1" and entry.version == ac.ENTRY_VERSION
    assert fake.blob_bytes(entry).startswith(archive.MAGIC)

    target = tmp_path / "b" / scope.name
    got = ac.restore_directory(service, target, "fxcache-v1-linux-x-run2.1",
                               ["fxcache-v1-linux-x-"])  # fmt: skip
    assert got is not None and got.matched == "fxcache-v1-linux-x-run1.1"
    assert _tree(target) == _tree(scope)
    # Each file as committed, mtime included: the local restore's fast check matches it.
    for rel in ("inductor/fx/graph.bin", "inductor/fx/empty"):
        assert (target / rel).stat().st_mtime_ns == (scope / rel).stat().st_mtime_ns
    assert got.unpacked.files == 2 and got.unpacked.total_bytes == len(b"kernel")
    assert fake.violations == []


def test_only_what_the_manifest_lists_is_archived(tmp_path: Path, fake: FakeCacheService) -> None:
    """A lock file torch opened, a file a job wrote without saving it, a symlink: never in
    the entry (the tar took whatever was in the directory)."""
    scope = _committed(tmp_path / "a" / "s", {"inductor/fx/graph.bin": b"kernel"},
                       **{"inductor/locks/x.lock": "", "inductor/fx/unsaved": "u"})  # fmt: skip
    (scope / "inductor" / "latest").symlink_to("fx")
    service = _service(fake)
    assert ac.save_directory(service, scope, "fxcache-v1-linux-x-run1.1")["uploaded"]
    target = tmp_path / "b" / "s"
    assert ac.restore_directory(service, target, "x", ["fxcache-v1-linux-x-"])
    assert set(_tree(target)) == {"inductor/fx/graph.bin", "manifest.json"}


def test_a_scope_that_changed_since_its_commit_is_not_uploaded(
    tmp_path: Path, fake: FakeCacheService
) -> None:
    """Every file is checked against the manifest as it is archived: an entry that every
    restore would refuse is never made."""
    scope = _scope(tmp_path / "a")
    graph = scope / "inductor/fx/graph.bin"
    graph.chmod(0o644)
    graph.write_bytes(b"KERNEL")  # same size, other bytes
    with pytest.raises(ac.CacheServiceError, match="changed since it was committed"):
        ac.save_directory(_service(fake), scope, "fxcache-v1-linux-x-run1.1")
    assert fake.committed() == []


def test_newest_entry_wins_and_other_prefixes_miss(tmp_path: Path, fake: FakeCacheService) -> None:
    service = _service(fake)
    ac.save_directory(service, _scope(tmp_path / "old", b"old"), "fxcache-v1-linux-x-run1.1")
    ac.save_directory(service, _scope(tmp_path / "new", b"new"), "fxcache-v1-linux-x-run2.1")
    target = tmp_path / "r" / "s"
    got = ac.restore_directory(service, target, "k-run3.1", ["fxcache-v1-linux-x-"])
    assert got is not None and got.matched == "fxcache-v1-linux-x-run2.1"
    assert (target / "inductor/fx/graph.bin").read_bytes() == b"new"
    assert ac.restore_directory(service, tmp_path / "r" / "t", "k", ["fxcache-v1-osx-"]) is None
    assert not (tmp_path / "r" / "t").exists()
    assert fake.violations == []


def test_large_archives_go_up_in_blocks(
    tmp_path: Path, fake: FakeCacheService, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ac, "SINGLE_SHOT_BYTES", 4096)
    monkeypatch.setattr(ac, "BLOCK_BYTES", 3000)
    scope = _scope(tmp_path / "a", os.urandom(20000))  # incompressible: several blocks
    service = _service(fake)
    assert ac.save_directory(service, scope, "fxcache-v1-linux-x-run1.1")["uploaded"]
    blocks = fake.blobs[fake.committed()[0].blob].blocks
    assert len(blocks) >= 7, len(blocks)
    target = tmp_path / "b" / "s"
    ac.restore_directory(service, target, "x", ["fxcache-v1-linux-x-"])
    assert _tree(target) == _tree(scope)
    assert fake.violations == []


def test_entries_are_immutable(tmp_path: Path, fake: FakeCacheService) -> None:
    service = _service(fake)
    scope = _scope(tmp_path)
    assert ac.save_directory(service, scope, "fxcache-v1-linux-x-run1.1")["uploaded"]
    again = ac.save_directory(service, scope, "fxcache-v1-linux-x-run1.1")
    assert again["uploaded"] is False and len(fake.committed()) == 1


def test_a_read_only_token_fails_the_upload_loudly(tmp_path: Path, fake: FakeCacheService) -> None:
    fake.read_only = True
    with pytest.raises(ac.CacheServiceError, match="HTTP 403"):
        ac.save_directory(_service(fake), _scope(tmp_path), "fxcache-v1-linux-x-run1.1")
    assert fake.committed() == []


@pytest.mark.parametrize(
    ("env", "reason"),
    [
        ({}, "JavaScript actions only"),
        ({"ACTIONS_RESULTS_URL": "http://x/", "ACTIONS_RUNTIME_TOKEN": "t"}, "legacy"),
    ],
)
def test_runtime_says_why_there_is_no_service(env: dict[str, str], reason: str) -> None:
    where, problem = ac.runtime(env)
    assert where is None and problem and reason in problem


def _entry_blob(tmp_path: Path, fake: FakeCacheService) -> tuple[ac.CacheService, bytes]:
    """A saved entry's bytes (the only one), and the service to restore it with."""
    service = _service(fake)
    scope = _committed(tmp_path / "a" / "s", {"inductor/fx/graph.bin": b"kernel" * 100,
                                              "triton/k/kernel.so": os.urandom(9000)})  # fmt: skip
    assert ac.save_directory(service, scope, "fxcache-v1-l-run1.1")["uploaded"]
    blob = fake.blobs[fake.committed()[0].blob]
    assert blob.data is not None
    return service, blob.data


def _header(data: bytes) -> tuple[dict[str, Any], bytes]:
    """The header of an archive's bytes, and the frames after it."""
    start = len(archive.MAGIC) + 4
    length = int.from_bytes(data[len(archive.MAGIC) : start], "little")
    text = zstandard.ZstdDecompressor().decompress(data[start : start + length])
    return json.loads(text), data[start + length :]


def _with_header(header: dict[str, Any], frames: bytes) -> bytes:
    packed = zstandard.ZstdCompressor().compress(json.dumps(header).encode())
    return archive.MAGIC + len(packed).to_bytes(4, "little") + packed + frames


def _hostile(kind: str, header: dict[str, Any], frames: bytes) -> bytes:
    """An entry altered as `kind` says: a name out of the scope, a file's bytes flipped,
    an offset past the frames, a frame whose header asks for more than its table says."""
    manifest = json.loads(header["manifest"])
    if kind == "escape":
        meta = manifest["files"].pop("inductor/fx/graph.bin")
        manifest["files"]["inductor/../../escaped"] = meta
        header["offsets"]["inductor/../../escaped"] = header["offsets"].pop("inductor/fx/graph.bin")
    elif kind == "flipped":
        body = bytearray(frames)
        body[-10] ^= 1  # in the raw frame of the random .so
        frames = bytes(body)
    elif kind == "offset":
        header["offsets"]["inductor/fx/graph.bin"] = 10**9
    elif kind == "bomb":
        bomb = zstandard.ZstdCompressor(level=1).compress(bytes(64 * 2**20))
        header["frames"] = [[2**20, len(bomb), "zstd"]]
        manifest["files"] = {"inductor/fx/big": {"size": 2**20, "sha256": "0" * 64}}
        manifest["total_bytes"] = 2**20
        header["offsets"] = {"inductor/fx/big": 0}
        frames = bomb
    header["manifest"] = json.dumps(manifest)
    return _with_header(header, frames)


@pytest.mark.parametrize("kind", ["escape", "flipped", "offset", "bomb"])
def test_a_hostile_archive_is_refused_and_leaves_nothing(
    tmp_path: Path, fake: FakeCacheService, kind: str
) -> None:
    service, data = _entry_blob(tmp_path, fake)
    header, frames = _header(data)
    fake.blobs[fake.committed()[0].blob].data = _hostile(kind, header, frames)
    target = tmp_path / "root" / "scope"
    with pytest.raises(ac.CacheServiceError, match="unusable cache archive"):
        ac.restore_directory(service, target, "k", ["fxcache-v1-l-"])
    assert not target.exists() and not (tmp_path / "escaped").exists()
    assert list((tmp_path / "root").iterdir()) == []


@pytest.mark.parametrize("cut", [0.1, 0.5, 0.99])
def test_a_truncated_download_leaves_nothing(
    tmp_path: Path, fake: FakeCacheService, cut: float
) -> None:
    service, data = _entry_blob(tmp_path, fake)
    fake.blobs[fake.committed()[0].blob].data = data[: int(len(data) * cut)]
    target = tmp_path / "b" / "s"
    with pytest.raises(ac.CacheServiceError, match="unusable cache archive"):
        ac.restore_directory(service, target, "k", ["fxcache-v1-l-"])
    assert not target.exists() and list(target.parent.iterdir()) == []


def test_the_fake_refuses_what_the_service_refuses(fake: FakeCacheService) -> None:
    twirp = f"{fake.url}/twirp/{ac.SERVICE}/CreateCacheEntry"
    body = {"key": "k", "version": ac.ENTRY_VERSION}
    wrong_token = ac.CacheService(ac.Runtime(fake.url, "wrong"), max_attempts=1)
    with pytest.raises(ac.CacheServiceError, match="HTTP 401"):
        wrong_token.create("k")
    bearer = {"Authorization": f"Bearer {fake.token}"}
    assert requests.post(twirp, data="{}", headers=bearer, timeout=5).status_code == 400
    camel = {"key": "k", "version": ac.ENTRY_VERSION, "restoreKeys": ["k"]}
    lookup = twirp.replace("CreateCacheEntry", "GetCacheEntryDownloadURL")
    assert requests.post(lookup, json=camel, headers=bearer, timeout=5).status_code == 400
    url = requests.post(twirp, json=body, headers=bearer, timeout=5).json()["signed_upload_url"]
    no_type = {"x-ms-version": ac.AZURE_API_VERSION}
    assert requests.put(url, data=b"x", headers=no_type, timeout=5).status_code == 400
    assert requests.put(url.split("&sig=")[0], data=b"x", timeout=5).status_code == 403
    assert len(fake.violations) == 5, fake.violations


# -- issue 26 §6: restored files keep the local store's modes; the prefix lookup never serves
# another key suffix's entry ----------------------------------------------------------------
SCOPE = "fxcache-v1-linux-x86_64-cp311-torch2.13.0+cpu-cpu-0123456789ab"


def _scope_of(root: Path, payload: bytes) -> Path:
    return _committed(root / SCOPE, {"inductor/fx/graph.bin": payload})


def _modes(root: Path) -> dict[str, int]:
    return {
        p.relative_to(root).as_posix(): stat.S_IMODE(p.lstat().st_mode)
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_an_archive_restore_vouches_for_each_file_it_wrote_until_one_changes(
    tmp_path: Path, fake: FakeCacheService
) -> None:
    """What the restore vouches for (store.seal.Fresh: every file checked as written, its
    inode and ctime) holds for what it wrote, and no longer once a file changed."""
    import time

    scope = _scope(tmp_path / "a")
    service = _service(fake)
    assert ac.save_directory(service, scope, "fxcache-v1-linux-x-run1.1")["uploaded"]
    target = tmp_path / "b" / scope.name
    got = ac.restore_directory(service, target, "fxcache-v1-linux-x-run2.1",
                               ["fxcache-v1-linux-x-"])  # fmt: skip
    assert got is not None
    written = got.unpacked.written
    raw = (target / "manifest.json").read_bytes()
    digest, manifest = hashlib.sha256(raw).hexdigest(), mf.parse(raw)
    assert written.unchanged(target, digest, manifest)
    assert written.sealed.listed is not None
    assert sorted(written.sealed.listed.names) == sorted(manifest["files"])
    time.sleep(0.05)  # past the coarse clock's tick in which the restore wrote the files
    graph = target / "inductor/fx/graph.bin"
    st = graph.stat()
    graph.chmod(0o644)
    graph.write_bytes(b"KERNEL")  # the same size, its mtime put back
    os.utime(graph, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert not written.unchanged(target, digest, manifest)


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
    committed = {rel: mode for rel, mode in local.items() if rel in (*SAMPLE, "manifest.json")}
    assert _modes(target) == committed


def test_the_unsuffixed_prefix_never_restores_a_suffixed_entry(
    tmp_path: Path, fake: FakeCacheService
) -> None:
    service = _service(fake)
    ac.save_directory(service, _scope_of(tmp_path / "a", b"ours"), f"{SCOPE}-run1.1")
    ac.save_directory(service, _scope_of(tmp_path / "b", b"modelB"), f"{SCOPE}-modelB-run2.1")
    target = tmp_path / "r" / SCOPE
    with pytest.raises(ac.CacheServiceError, match="longer key suffix"):
        ac.restore_directory(service, target, f"{SCOPE}-run3.1", [f"{SCOPE}-"])
    assert not target.exists()  # a cold start, never modelB's graphs
    assert fake.violations == []


def test_a_suffixed_prefix_never_restores_a_longer_suffix_or_no_suffix(
    tmp_path: Path, fake: FakeCacheService
) -> None:
    service = _service(fake)
    ac.save_directory(service, _scope_of(tmp_path / "a", b"plain"), f"{SCOPE}-run1.1")
    prefix = f"{SCOPE}-modelB-"
    assert (
        ac.restore_directory(service, tmp_path / "r1" / SCOPE, f"{prefix}run5.1", [prefix]) is None
    )
    ac.save_directory(service, _scope_of(tmp_path / "b", b"mine"), f"{prefix}run2.1")
    ac.save_directory(service, _scope_of(tmp_path / "c", b"longer"), f"{SCOPE}-modelB-x-run3.1")
    with pytest.raises(ac.CacheServiceError, match="longer key suffix"):
        ac.restore_directory(service, tmp_path / "r2" / SCOPE, f"{prefix}run5.1", [prefix])
    ac.save_directory(service, _scope_of(tmp_path / "d", b"mine, newer"), f"{prefix}run4.1")
    target = tmp_path / "r3" / SCOPE
    got = ac.restore_directory(service, target, f"{prefix}run5.1", [prefix])
    assert got is not None and got.matched == f"{prefix}run4.1"
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


@pytest.mark.parametrize("kind", ["gzip", "zstd tar", "header"])
def test_an_archive_of_another_format_or_beyond_the_memory_bound_is_refused(
    tmp_path: Path, kind: str
) -> None:
    """Entries of the earlier formats (never offered: their version differs; refused if one
    came), and a header larger than any save writes: refused before anything is allocated
    or written."""
    if kind == "header":
        data = archive.MAGIC + (archive.MAX_HEADER_STORED + 1).to_bytes(4, "little") + b"x" * 64
    else:
        tar = b"inductor/fx/x" + bytes(500)
        data = gzip.compress(tar) if kind == "gzip" else zstandard.ZstdCompressor().compress(tar)
    target = tmp_path / "root" / "scope"
    target.parent.mkdir()
    read = io.BytesIO(data).read
    with pytest.raises(archive.ArchiveError):
        archive.extract(read, target)
    assert not target.exists() and list((tmp_path / "root").iterdir()) == []
    assert read() == data[len(archive.MAGIC) + 4 :]  # refused on its first 12 bytes


_EXTRACT = """import sys
from pathlib import Path
from ci_fxcache.store.remote.github import archive
if sys.argv[1] == "extract":
    with open(sys.argv[2], "rb") as f:
        archive.extract(f.read, Path(sys.argv[3]))
"""
# Linux keeps the high-water RSS of the image a process replaced at exec: a child forked from
# this (large) test process would report this process's RSS. A small launcher runs the child
# and reports the child's own peak (as test_store_s3_data does).
_PEAK = """import os, subprocess, sys
proc = subprocess.Popen(sys.argv[1:])
_pid, status, usage = os.wait4(proc.pid, 0)
assert os.waitstatus_to_exitcode(status) == 0
print(usage.ru_maxrss)
"""


def test_a_restore_holds_a_bounded_part_of_the_archive_in_memory(tmp_path: Path) -> None:
    """128 MiB that do not compress, in files larger than a worker's run (decoded frame by
    frame as they arrive) and in small ones (runs handed to the workers): the restore's peak
    RSS stays within the stated bound above the same interpreter's without a restore."""
    import subprocess
    import sys

    from ci_fxcache.env.cpus import usable_cpus
    from ci_fxcache.store.remote import packs

    big = {f"triton/big{i}/kernel.so": os.urandom(8 << 20) for i in range(12)}
    small = {f"inductor/fxgraph/{i % 64:02x}/e{i}": os.urandom(32 << 10) for i in range(1024)}
    scope = _committed(tmp_path / "a" / "s", {**big, **small})
    entry = tmp_path / "entry"
    archive.write(scope, entry)
    del big, small

    def peak(*args: str) -> int:
        child = [sys.executable, "-c", _EXTRACT, *args]
        proc = subprocess.run([sys.executable, "-c", _PEAK, *child], capture_output=True,
                              text=True, check=True)  # fmt: skip
        return int(proc.stdout) * 1024

    baseline = peak("baseline")
    restored = peak("extract", str(entry), str(tmp_path / "b"))
    spans = (usable_cpus() + 1) * 2 * archive.SPAN_BYTES  # one per worker, one being read
    frames = (usable_cpus() + 2) * packs.FRAME_BYTES  # decoded per worker; a big file's frame
    assert restored - baseline < spans + frames + (8 << 20), (restored - baseline) >> 20
    assert _tree(tmp_path / "b") == _tree(scope)
