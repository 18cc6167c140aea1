"""`store: s3`'s data path against the real SeaweedFS (tests/s3_server.py): compressed packs,
scopes of the first format, ranged and bounded reads, and restores through a simulated link
(tests/link_proxy.py). The fixtures and helpers are test_store_s3.py's."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
from pathlib import Path
from typing import Any

import zstandard

from tests.conftest import RunFxcache
from tests.s3_server import SeaweedS3
from tests.store_helpers import SAMPLE, tree_digest
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
