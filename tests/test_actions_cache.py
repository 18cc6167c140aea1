"""The toolkit's own client of the Actions cache service v2
(ci_fxcache/store/remote/github/cache_service.py) against the strict fake
(tests/fake_cache_service.py)."""

from __future__ import annotations

import gzip
import io
import json
import os
import stat
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
import zstandard

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


def _scope(root: Path, payload: bytes = b"kernel") -> Path:
    scope = root / "fxcache-v1-linux-x"
    (scope / "inductor" / "fx").mkdir(parents=True)
    (scope / "inductor" / "fx" / "graph.bin").write_bytes(payload)
    (scope / "manifest.json").write_text('{"files": {}}')
    (scope / "inductor" / "latest").symlink_to("fx")
    return scope


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
    plain = zstandard.ZstdDecompressor().decompressobj().decompress(fake.blob_bytes(entry))
    with tarfile.open(fileobj=io.BytesIO(plain), mode="r:") as tar:
        assert "inductor/fx/graph.bin" in tar.getnames()

    target = tmp_path / "b" / scope.name
    matched = ac.restore_directory(service, target, "fxcache-v1-linux-x-run2.1",
                                   ["fxcache-v1-linux-x-"])  # fmt: skip
    assert matched == "fxcache-v1-linux-x-run1.1"
    assert _tree(target) == _tree(scope)
    assert fake.violations == []


def test_newest_entry_wins_and_other_prefixes_miss(tmp_path: Path, fake: FakeCacheService) -> None:
    service = _service(fake)
    ac.save_directory(service, _scope(tmp_path / "old", b"old"), "fxcache-v1-linux-x-run1.1")
    ac.save_directory(service, _scope(tmp_path / "new", b"new"), "fxcache-v1-linux-x-run2.1")
    target = tmp_path / "r" / "s"
    assert ac.restore_directory(service, target, "k-run3.1", ["fxcache-v1-linux-x-"]) == (
        "fxcache-v1-linux-x-run2.1"
    )
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


def test_a_hostile_archive_is_refused_and_leaves_nothing(tmp_path: Path) -> None:
    archive = tmp_path / "evil.tar.zst"
    plain = io.BytesIO()
    with tarfile.open(fileobj=plain, mode="w:") as tar:
        info = tarfile.TarInfo("../../escaped")
        info.size = 4
        tar.addfile(info, io.BytesIO(b"evil"))
    archive.write_bytes(zstandard.ZstdCompressor().compress(plain.getvalue()))
    target = tmp_path / "root" / "scope"
    with pytest.raises(ac.CacheServiceError, match="unusable cache archive"):
        ac.unpack(archive, target)
    assert not target.exists() and not (tmp_path / "escaped").exists()
    assert list((tmp_path / "root").iterdir()) == []


def test_a_truncated_download_leaves_nothing(tmp_path: Path, fake: FakeCacheService) -> None:
    service = _service(fake)
    ac.save_directory(service, _scope(tmp_path / "a", os.urandom(50000)), "fxcache-v1-l-run1.1")
    blob = fake.blobs[fake.committed()[0].blob]
    assert blob.data is not None
    blob.data = blob.data[: len(blob.data) // 2]
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


@pytest.mark.parametrize("kind", ["gzip", "window"])
def test_an_archive_of_another_format_or_beyond_the_memory_bound_is_refused(
    tmp_path: Path, kind: str
) -> None:
    """An entry of the gzip format (never offered: its version differs; refused if it came),
    and a zstd archive whose frame asks for a 128 MiB window (a bomb's memory): refused
    before anything is allocated or written."""
    plain = io.BytesIO()
    with tarfile.open(fileobj=plain, mode="w:") as tar:
        info = tarfile.TarInfo("inductor/fx/x")
        data = os.urandom(64) * 4096
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    archive = tmp_path / "a"
    if kind == "gzip":
        archive.write_bytes(gzip.compress(plain.getvalue()))
    else:
        params = zstandard.ZstdCompressionParameters.from_level(1, window_log=27)
        writer = zstandard.ZstdCompressor(compression_params=params)
        with archive.open("wb") as f, writer.stream_writer(f) as out:
            out.write(plain.getvalue())  # streamed: no content size, the window stays 128 MiB
    target = tmp_path / "root" / "scope"
    with pytest.raises(ac.CacheServiceError, match="unusable cache archive"):
        ac.unpack(archive, target)
    assert not target.exists() and list((tmp_path / "root").iterdir()) == []
