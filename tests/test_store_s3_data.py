"""`store: s3`'s data path against the real SeaweedFS (tests/s3_server.py): compressed packs,
scopes of the first format, ranged and bounded reads, and restores through a simulated link
(tests/link_proxy.py). The fixtures and helpers are test_store_s3.py's."""

from __future__ import annotations

import gc
import gzip
import hashlib
import json
import os
import struct
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

import pytest
import zstandard

from ci_fxcache.store.layout import CACHE_DIRS, Layout
from ci_fxcache.store.remote.s3.client import parse_url
from ci_fxcache.store.remote.s3.tier import S3Tier
from ci_fxcache.store.remote.tier import RemoteCorrupt
from tests.conftest import TORCH_PYTHON, RunFxcache
from tests.link_proxy import Link
from tests.s3_server import SeaweedS3
from tests.store_helpers import SAMPLE, end_lease_holders, tree_digest
from tests.test_store_s3 import _first_job, _objects, _save_json, _store
from tests.test_store_s3 import bucket as bucket  # the fixture

GENERATED = b"def kernel(in_ptr0, out_ptr0, xnumel, XBLOCK: tl.constexpr):\n    x0 = xindex\n"


def _split(url: str) -> tuple[str, str]:
    name, _, prefix = url.removeprefix("s3://").partition("/")
    return name, prefix


def test_the_bucket_holds_compressed_packs_and_an_empty_runner_gets_every_file_back(
    tmp_path: Path, run_fxcache: RunFxcache, seaweed: SeaweedS3, bucket: str
) -> None:
    text = GENERATED * 15000  # ~1.1 MB of generated source: compresses
    kernel = os.urandom(300_000)  # a compiled kernel's bytes: do not compress
    files = {**SAMPLE, "inductor/fxgraph/ee/generated": text, "triton/K2/kernel.cubin": kernel}
    a = _store(tmp_path, "a", run_fxcache, seaweed, bucket)
    _first_job(a, files)
    stored = {k: v for k, v in _objects(seaweed, bucket).items() if "/packs/" in k}
    packed = sum(len(v) for v in stored.values())
    assert packed < len(kernel) + len(text) // 50, (packed, sum(map(len, files.values())))
    assert any(kernel in body for body in stored.values())  # stored as it is
    b = _store(tmp_path, "b", run_fxcache, seaweed, bucket)
    got = b.restore("--store", "s3")
    assert got["hit"] and got["remote"]["fetched"] and got["files"] == len(files), got
    assert got["remote"]["downloaded_bytes"] < packed + 20_000, got["remote"]
    restored = Path(got["scope_dir"])
    for rel, body in files.items():
        assert (restored / rel).read_bytes() == body, rel


def _to_first_format(seaweed: SeaweedS3, url: str, files: dict[str, bytes]) -> None:
    """Rewrite the bucket's one scope as a save before compression wrote it: a raw pack, a
    gzip segment/1, the head naming them (its other fields as the save wrote them)."""
    s3: Any = seaweed.client()
    name, prefix = _split(url)
    for key in _objects(seaweed, url):
        if "/packs/" in key or "/segments/" in key:
            s3.delete_object(Bucket=name, Key=key)
    body, entries = b"", {}
    for rel, data in sorted(files.items()):
        entries[rel] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data),
                        "offset": len(body)}  # fmt: skip
        body += data
    pack = hashlib.sha256(body).hexdigest()
    for e in entries.values():
        e["pack"] = pack
    segment = gzip.compress(
        json.dumps({"schema": "fxcache-s3-segment/1", "files": entries}, sort_keys=True).encode(),
        6,
        mtime=0,
    )
    digest = hashlib.sha256(segment).hexdigest()
    (head_key,) = [k for k in _objects(seaweed, url) if k.endswith("/head.json")]
    head = json.loads(s3.get_object(Bucket=name, Key=head_key)["Body"].read())
    assert head["schema"] == "fxcache-s3-head/1"
    head["segments"] = [{"sha256": digest, "files": len(entries), "packs": [pack]}]
    s3.put_object(Bucket=name, Key=f"{prefix}/packs/{pack}", Body=body)
    s3.put_object(Bucket=name, Key=f"{prefix}/segments/{digest}", Body=segment)
    s3.put_object(Bucket=name, Key=head_key, Body=json.dumps(head).encode())


def test_a_scope_saved_before_compression_restores_and_the_next_save_writes_the_new_format(
    tmp_path: Path, run_fxcache: RunFxcache, seaweed: SeaweedS3, bucket: str
) -> None:
    a = _store(tmp_path, "a", run_fxcache, seaweed, bucket)
    _first_job(a)
    _to_first_format(seaweed, bucket, SAMPLE)
    b = _store(tmp_path, "b", run_fxcache, seaweed, bucket)
    got = b.restore("--store", "s3")
    assert got["hit"] and got["remote"]["fetched"] and got["files"] == len(SAMPLE), got
    new = {"inductor/fxgraph/ff/new": GENERATED * 300}
    (Path(got["inductor_dir"]).parent / "inductor/fxgraph/ff").mkdir(parents=True)
    (Path(got["inductor_dir"]).parent / "inductor/fxgraph/ff/new").write_bytes(GENERATED * 300)
    saved = _save_json(b)["remote"]
    assert saved["published"] and saved["uploaded_files"] == 1, saved  # the old pack is reused
    segments = [v for k, v in _objects(seaweed, bucket).items() if "/segments/" in k]
    newest = [zstandard.ZstdDecompressor().decompress(s) for s in segments if s[:2] != b"\x1f\x8b"]
    assert [json.loads(s)["schema"] for s in newest] == ["fxcache-s3-segment/2"]
    c = _store(tmp_path, "c", run_fxcache, seaweed, bucket)
    every = c.restore("--store", "s3")
    assert every["hit"] and every["files"] == len(SAMPLE) + 1, every
    assert tree_digest(Path(every["scope_dir"])).keys() >= {*SAMPLE, *new}


# Linux keeps the high-water RSS of the image a process replaced at exec, so a child forked
# straight from this (large, long-lived) test process would report this process's RSS: the
# restore runs under a small launcher, and the launcher reports its child's peak alone.
_MEASURE = """import os, subprocess, sys
proc = subprocess.Popen(sys.argv[2:])
_pid, status, usage = os.wait4(proc.pid, 0)
with open(sys.argv[1], "w") as out:
    out.write(f"{os.waitstatus_to_exitcode(status)} {usage.ru_maxrss}")
"""


def _peak_rss_mib(store: Any, *args: str) -> tuple[dict[str, Any], float]:
    """`fxcache restore` of `store` in a child process: its state and its peak RSS (MiB)."""
    cmd = [sys.executable, "-m", "ci_fxcache", "restore", "--root", str(store.root),
           "--python", TORCH_PYTHON, "--json", "--state-file",
           str(store.root.parent / "state.json"), *args]  # fmt: skip
    measured = store.root.parent / "peak-rss"
    with tempfile.TemporaryFile() as out:
        subprocess.run([sys.executable, "-c", _MEASURE, str(measured), *cmd],
                       env={**os.environ, **store.env}, stdout=out, stderr=subprocess.DEVNULL,
                       check=True)  # fmt: skip
        out.seek(0)
        state: dict[str, Any] = json.loads(out.read())
    code, peak_kib = measured.read_text().split()
    assert code == "0", code
    return state, int(peak_kib) / 1024


def _gzip_bomb(decoded_mib: int) -> bytes:
    """A gzip member that decodes to a JSON segment padded with `decoded_mib` MiB of spaces
    (~1,000:1): one fully flushed deflate block repeated, then the trailer."""
    head = b'{"schema": "fxcache-s3-segment/1", "files": {}, "pad": "'
    block = b" " * (1 << 20)
    deflate = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
    first = deflate.compress(head) + deflate.flush(zlib.Z_FULL_FLUSH)
    repeated = deflate.compress(block) + deflate.flush(zlib.Z_FULL_FLUSH)
    tail = deflate.compress(b'"}') + deflate.flush()
    crc = zlib.crc32(head)
    for _ in range(decoded_mib):
        crc = zlib.crc32(block, crc)
    crc = zlib.crc32(b'"}', crc)
    size = len(head) + decoded_mib * len(block) + 2
    header = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"
    trailer = struct.pack("<II", crc, size & 0xFFFFFFFF)
    return header + first + repeated * decoded_mib + tail + trailer


def test_a_segment_bomb_is_refused_within_a_memory_bound(
    tmp_path: Path, run_fxcache: RunFxcache, seaweed: SeaweedS3, bucket: str
) -> None:
    """Issue 32: a 1.5 MB gzip segment took a restore to 4.77 GB. A bucket writer (no key in
    use) names a segment that decodes to 1 GiB: the restore refuses it with its peak RSS far
    below that (the old code held the whole decoded segment)."""
    a = _store(tmp_path, "a", run_fxcache, seaweed, bucket)
    key = _first_job(a)["scope_key"]
    s3: Any = seaweed.client()
    name, prefix = _split(bucket)
    bomb = _gzip_bomb(1024)
    assert len(bomb) < 2 * 2**20
    digest = hashlib.sha256(bomb).hexdigest()
    s3.put_object(Bucket=name, Key=f"{prefix}/segments/{digest}", Body=bomb)
    head_key = f"{prefix}/scopes/{key}/head.json"
    head = json.loads(s3.get_object(Bucket=name, Key=head_key)["Body"].read())
    head["segments"] = [{"sha256": digest, "files": 1, "packs": []}]
    s3.put_object(Bucket=name, Key=head_key, Body=json.dumps(head).encode())
    b = _store(tmp_path, "b", run_fxcache, seaweed, bucket)
    state, peak = _peak_rss_mib(b, "--store", "s3")
    assert peak < 512, f"peak RSS {peak:.0f} MiB"
    assert not state["hit"] and "unreadable" in state["remote"]["error"], state["remote"]


def _link_store(
    tmp_path: Path, name: str, run: RunFxcache, seaweed: SeaweedS3, url: str, link: Link,
    **env: str,
) -> Any:  # fmt: skip
    return _store(tmp_path, name, run, seaweed, url, AWS_ENDPOINT_URL_S3=link.endpoint, **env)


def test_a_keyed_reader_never_reads_an_index_object_larger_than_any_save_writes(
    tmp_path: Path, run_fxcache: RunFxcache, seaweed: SeaweedS3, bucket: str
) -> None:
    """The signed head names its segment by sha256, so a replaced segment is refused by a
    keyed reader, but only after reading it: now its size is refused before the body."""
    a = _store(tmp_path, "a", run_fxcache, seaweed, bucket, FXCACHE_SIGNING_KEY="k1")
    _first_job(a)
    s3: Any = seaweed.client()
    name, _prefix = _split(bucket)
    (segment,) = [k for k in _objects(seaweed, bucket) if "/segments/" in k]
    s3.put_object(Bucket=name, Key=segment, Body=os.urandom(1024) * (17 * 1024))  # 17 MiB
    host, _, port = seaweed.endpoint.removeprefix("http://").rpartition(":")
    with Link((host, int(port)), total_mbit=16) as link:  # 17 MiB would take ~9 s
        b = _link_store(tmp_path, "b", run_fxcache, seaweed, bucket, link,
                        FXCACHE_SIGNING_KEY="k1")  # fmt: skip
        got = b.restore("--store", "s3")
        moved = link.forwarded_bytes
    assert not got["hit"] and "too large" in got["remote"]["error"], got["remote"]
    assert moved < 8 * 2**20  # the 17 MiB body was not read (what crossed: socket buffers)


def test_a_restore_through_a_link_with_latency_gets_every_file_in_ranges(
    tmp_path: Path, run_fxcache: RunFxcache, seaweed: SeaweedS3, bucket: str
) -> None:
    files = {**SAMPLE, "triton/K3/kernel.cubin": os.urandom(3 * 2**20),
             "inductor/fxgraph/ee/generated": GENERATED * 40000}  # fmt: skip
    a = _store(tmp_path, "a", run_fxcache, seaweed, bucket)
    _first_job(a, files)
    host, _, port = seaweed.endpoint.removeprefix("http://").rpartition(":")
    with Link((host, int(port)), total_mbit=200, conn_mbit=100, rtt_ms=20) as link:
        b = _link_store(tmp_path, "b", run_fxcache, seaweed, bucket, link)
        got = b.restore("--store", "s3")
    assert got["hit"] and got["files"] == len(files), got["remote"]
    for rel, body in files.items():
        assert (Path(got["scope_dir"]) / rel).read_bytes() == body, rel


def test_a_link_slower_than_the_time_bound_ends_the_restore_at_the_bound(
    tmp_path: Path, run_fxcache: RunFxcache, seaweed: SeaweedS3, bucket: str
) -> None:
    """A pack streams in slower than FXCACHE_S3_DEADLINE allows (each read answers within
    the socket's timeout, so only the bound can stop it): the restore gives up at the bound,
    one warning, cold; it never waits for the whole pack."""
    a = _store(tmp_path, "a", run_fxcache, seaweed, bucket)
    _first_job(a, {**SAMPLE, "triton/K4/kernel.cubin": os.urandom(2 * 2**20)})
    host, _, port = seaweed.endpoint.removeprefix("http://").rpartition(":")
    with Link((host, int(port)), total_mbit=1) as link:  # 2 MiB take ~17 s
        b = _link_store(tmp_path, "b", run_fxcache, seaweed, bucket, link,
                        FXCACHE_S3_DEADLINE="3")  # fmt: skip
        got = b.restore("--store", "s3")
        moved = link.forwarded_bytes
    assert not got["hit"] and "time bound" in got["remote"]["error"], got["remote"]
    assert [w for w in got["_stderr"].splitlines() if "warning" in w], got["_stderr"]
    assert moved < 2**20  # it stopped reading: most of the pack never crossed the link


def test_a_fetch_seals_what_it_made_and_a_file_added_afterwards_is_still_found(
    tmp_path: Path, run_fxcache: RunFxcache, seaweed: SeaweedS3, bucket: str
) -> None:
    """The fetch made every directory and file of the scope and checked each file as it
    wrote it: it leaves the seal of what it made (store.seal), so the local restore that
    follows stats them instead of listing every directory again. A seal only speeds the
    check up: a file added to a fetched directory afterwards is still found."""
    a = _store(tmp_path, "a", run_fxcache, seaweed, bucket)
    _first_job(a)
    b = _store(tmp_path, "b", run_fxcache, seaweed, bucket)
    got = b.restore("--store", "s3")
    assert got["hit"] and got["remote"]["fetched"], got
    sealed = json.loads(Layout(b.root).seal(got["scope_key"]).read_text())
    parents = {rel.rsplit("/", n)[0] for rel in SAMPLE for n in (1, 2) if rel.count("/") >= n}
    assert set(sealed["dirs"]) == parents | set(CACHE_DIRS), sealed["dirs"]
    assert sorted(sealed["files"]) == sorted(SAMPLE) and sealed["signed"] is False
    end_lease_holders(b.root)  # the job ended without saving
    time.sleep(0.05)  # past the coarse clock's tick in which the fetch stamped its directories
    planted = Path(got["scope_dir"]) / "inductor/fxgraph/ab/planted"
    planted.write_bytes(b"never saved")
    again = b.restore("--store", "s3", state="again.json")
    assert again["hit"] and again["set_aside"] == {"files": 1, "to": again["set_aside"]["to"]}
    assert not planted.exists()


def test_a_client_that_cannot_be_configured_is_one_warning_and_the_restore_goes_on(
    tmp_path: Path, run_fxcache: RunFxcache, seaweed: SeaweedS3, bucket: str
) -> None:
    """The client is made on a thread of its own while the fingerprint is taken: a
    configuration botocore refuses there (a profile that does not exist) still reaches the
    restore as one warning, then local-only operation."""
    b = _store(tmp_path, "b", run_fxcache, seaweed, bucket, AWS_PROFILE="no-such-profile")
    got = b.restore("--store", "s3")
    assert not got["hit"] and "not configured" in got["remote"]["error"], got["remote"]
    assert len([w for w in got["_stderr"].splitlines() if "warning" in w]) == 1, got["_stderr"]


def test_a_fetch_collects_no_garbage_while_it_runs_and_leaves_the_collector_as_it_was(
    tmp_path: Path, run_fxcache: RunFxcache, seaweed: SeaweedS3, bucket: str
) -> None:
    a = _store(tmp_path, "a", run_fxcache, seaweed, bucket)
    key = _first_job(a)["scope_key"]
    os.environ.update(seaweed.env())  # the tier reads the AWS chain from the environment
    tier = S3Tier(parse_url(bucket))
    seen: list[bool] = []
    tier.index = lambda *args: (seen.append(gc.isenabled()), S3Tier.index(tier, *args))[1]
    layout = Layout(tmp_path / "c")
    try:
        assert tier.fetch(layout, key, tmp_path / "c-fetch", None) is not None
        assert seen == [False] and gc.isenabled()
        s3: Any = seaweed.client()
        name, _prefix = _split(bucket)
        for pack in [k for k in _objects(seaweed, bucket) if "/packs/" in k]:
            s3.delete_object(Bucket=name, Key=pack)
        with pytest.raises(RemoteCorrupt):
            tier.fetch(layout, key, tmp_path / "d-fetch", None)
        assert gc.isenabled()
    finally:
        for name in seaweed.env():
            os.environ.pop(name, None)


def test_a_fetch_checks_a_pack_read_whole_by_its_name_and_a_flipped_byte_names_its_file(
    tmp_path: Path,
    run_fxcache: RunFxcache,
    seaweed: SeaweedS3,
    bucket: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A pack read whole is checked once against its name (no file hashed); a byte flipped in
    it that still decodes fails that check, and then each file is: the one it altered is
    named and not left in the fetch, the rest are whole."""
    from ci_fxcache.store.remote import packs

    kernel = os.urandom(300_000)  # stored raw: a flipped byte still decodes
    files = {**SAMPLE, "triton/K2/kernel.cubin": kernel}
    a = _store(tmp_path, "a", run_fxcache, seaweed, bucket)
    key = _first_job(a, files)["scope_key"]
    hashed: list[int] = []
    real = packs.sha256_hex
    monkeypatch.setattr(packs, "sha256_hex", lambda data: hashed.append(len(data)) or real(data))
    for var, value in seaweed.env().items():  # the tier reads the AWS chain from there
        monkeypatch.setenv(var, value)
    tier = S3Tier(parse_url(bucket))
    got = tier.fetch(Layout(tmp_path / "b"), key, tmp_path / "b-fetch", None)
    assert got is not None and got.files == len(files)
    assert got.detail["packs"] == got.detail["ranges"] == 1, got.detail
    assert not [n for n in hashed if n], hashed  # no file's bytes hashed: the pack's were
    for rel, body in files.items():
        assert (tmp_path / "b-fetch" / rel).read_bytes() == body, rel
    s3: Any = seaweed.client()
    name, _prefix = _split(bucket)
    (pack,) = [k for k in _objects(seaweed, bucket) if "/packs/" in k]
    body = bytearray(s3.get_object(Bucket=name, Key=pack)["Body"].read())
    at = bytes(body).index(kernel) + 1000
    body[at] ^= 1
    s3.put_object(Bucket=name, Key=pack, Body=bytes(body))
    with pytest.raises(RemoteCorrupt) as refused:
        S3Tier(parse_url(bucket)).fetch(Layout(tmp_path / "c"), key, tmp_path / "c-fetch", None)
    assert refused.value.problems == [f"altered: triton/K2/kernel.cubin (pack {pack[-64:][:12]})"]
    assert not (tmp_path / "c-fetch" / "triton/K2/kernel.cubin").exists()
    for rel, data in SAMPLE.items():
        assert (tmp_path / "c-fetch" / rel).read_bytes() == data, rel
