"""`store: s3` references a keyless bucket writer cannot use (issue 48 point 3): a flood of
planted references never hides a signed one, reference reads are bounded in total, a signed
reference replayed under another name is refused, and planted scopes never make a keyed
clean-up remove the real one. Each test is the attack against the real SeaweedFS of the
session (tests/s3_server.py), with what a writer without the key can do: PUT any object.
Scopes are a few small files, no compiles."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import RunFxcache
from tests.s3_server import SeaweedS3
from tests.store_helpers import SAMPLE, tree_digest, write_files
from tests.test_store_s3 import _first_job, _store
from tests.test_store_s3 import bucket as bucket  # the fixture
from tests.test_store_s3_fleet import (
    _bucket_name,
    _committed_copies,
    _in_process_env,
    _restore_in_process,
    _tier,
)
from tests.test_store_s3_refs import _lose_the_head, _one_reference, _publish, _refs


def _plant(seaweed: SeaweedS3, url: str, key: str, bodies: dict[str, bytes]) -> None:
    """PUT `bodies` (reference name -> bytes) under scope `key`'s references, as a writer
    without the key can."""
    name, prefix = _bucket_name(url)
    s3: Any = seaweed.client()

    def put(item: tuple[str, bytes]) -> None:
        s3.put_object(Bucket=name, Key=f"{prefix}/scopes/{key}/refs/{item[0]}", Body=item[1])

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(put, bodies.items()))


def _flood(how: str) -> dict[str, bytes]:
    """256 unsigned references named older than any real one, or 257 names of no format."""
    if how == "256 references":
        return {f"{i:013d}-{i:016x}": b"{}" for i in range(256)}
    return {f"0-planted-{i:04d}": b"{}" for i in range(257)}


def _runner_with(src: Path, key: str, root: Path, files: dict[str, bytes]) -> Path:
    """A runner root holding scope `key` of store `src` committed plus `files`."""
    from ci_fxcache.store import manifest as mf
    from ci_fxcache.store.layout import Layout

    (root,) = _committed_copies(src, key, [root], 0)
    layout = Layout(root)
    write_files(layout.scope(key), files)
    found, problems = mf.scan(layout.scope(key))
    assert problems == []
    entries = mf.file_entries(layout.scope(key), found)
    base = mf.load(layout.manifest(key))
    manifest = {**base, "files": entries, "total_bytes": sum(m["size"] for m in entries.values())}
    mf.write_atomic(layout.manifest(key), manifest, root / ".locks")
    return root


@pytest.mark.parametrize("how", ["256 references", "257 other names"])
def test_a_flood_of_planted_references_never_hides_a_signed_one(
    tmp_path: Path, run_fxcache: RunFxcache, seaweed: SeaweedS3, bucket: str,
    monkeypatch: pytest.MonkeyPatch, how: str,
) -> None:  # fmt: skip
    """The flood sorts before the one signed reference: a keyed reader still merges it; the
    next keyed save folds it and removes every planted reference; a keyed clean-up removes a
    second flood, and a keyless one says it needs the key."""
    from ci_fxcache.store.policies import Policy
    from ci_fxcache.store.remote.s3 import invalidate

    key, _root = _one_reference(tmp_path, run_fxcache, seaweed, bucket, monkeypatch, "k1")
    _plant(seaweed, bucket, key, _flood(how))
    got, target = _restore_in_process(bucket, tmp_path / "reader", key, "k1")
    assert got.files == len(SAMPLE) + 2, got
    assert {"inductor/fxgraph/r0/e0", "inductor/fxgraph/r0/e1"} <= set(tree_digest(target))
    (c_root,) = _committed_copies(tmp_path / "a" / "root", key, [tmp_path / "c"], 3)
    saved = _publish(_tier(bucket), c_root, key, "k1")
    assert saved["via"] == "head" and saved["refs_folded"] == 1, saved
    assert saved["refs_removed"] == len(_flood(how)), saved
    assert _refs(seaweed, bucket, key) == {}
    _plant(seaweed, bucket, key, _flood(how))
    keyless = invalidate.run(_tier(bucket), Policy(), dry_run=False)["gc"]
    assert "FXCACHE_SIGNING_KEY" in keyless["needs_key"], keyless
    keyed = invalidate.run(_tier(bucket), Policy(), dry_run=False, signing_key="k1")["gc"]
    assert keyed["refs_dropped"] == len(_flood(how)) and "needs_key" not in keyed, keyed
    assert _refs(seaweed, bucket, key) == {}
    got, _ = _restore_in_process(bucket, tmp_path / "reader2", key, "k1")
    assert got.files == len(SAMPLE) + 3


def _fetch(url: str, root: Path, key: str, signing_key: str | None) -> tuple[Any, int]:
    """A restore of `key` into a fresh runner `root`: what it fetched, and the bytes it read."""
    from ci_fxcache.store.layout import Layout

    (root / ".remote").mkdir(parents=True)
    tier = _tier(url)
    got = tier.fetch(Layout(root), key, root / ".remote" / "fetched", signing_key)
    return got, int(tier.stats()["downloaded_bytes"])


def test_reference_reads_are_bounded_in_total_with_a_warning_naming_what_was_skipped(
    tmp_path: Path, run_fxcache: RunFxcache, seaweed: SeaweedS3, bucket: str,
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """12 planted references of 900 kB each, named after a keyless scope's real one: a
    keyless restore reads the real one and then at most the bound (here 3 MiB) of
    references, and warns naming the first it skipped."""
    from ci_fxcache.store.remote.s3 import refs

    key, _root = _one_reference(tmp_path, run_fxcache, seaweed, bucket, monkeypatch, None)
    ((_, body),) = _refs(seaweed, bucket, key).items()
    now = int(time.time() * 1000) + 60_000
    padded = body + b" " * 900_000  # still a reference any keyless reader takes
    planted = {f"{now + i:013d}-{i:016x}": padded for i in range(12)}
    _plant(seaweed, bucket, key, planted)
    monkeypatch.setattr(refs, "REFS_BYTES", 3 * 1024 * 1024, raising=False)
    capfd.readouterr()
    got, read = _fetch(bucket, tmp_path / "reader", key, None)
    assert got.files == len(SAMPLE) + 2, got
    assert read < 3 * 1024 * 1024 + 256 * 1024, read  # the bound, and the head, packs, segments
    err = capfd.readouterr().err
    assert "not read" in err and any(n in err for n in planted), err


def test_a_keyed_restore_downloads_no_planted_reference(
    tmp_path: Path, run_fxcache: RunFxcache, seaweed: SeaweedS3, bucket: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """12 planted references of 900 kB each (the signed one's body, unsigned): a keyed
    restore never downloads one (24 of 16 MiB cost every keyed restore 384 MiB)."""
    key, _root = _one_reference(tmp_path, run_fxcache, seaweed, bucket, monkeypatch, "k1")
    ((_, signed),) = _refs(seaweed, bucket, key).items()
    unsigned = json.loads(signed)
    unsigned.pop("signature")
    fat = json.dumps(unsigned).encode() + b" " * 900_000
    now = int(time.time() * 1000) + 60_000
    _plant(seaweed, bucket, key, {f"{now + i:013d}-{i:016x}": fat for i in range(12)})
    got, read = _fetch(bucket, tmp_path / "reader", key, "k1")
    assert got.files == len(SAMPLE) + 2, got
    assert read < 900_000, read


@pytest.mark.parametrize("how", ["renamed newest", "over a newer one"])
def test_a_signed_reference_replayed_under_another_name_is_refused(
    tmp_path: Path, run_fxcache: RunFxcache, seaweed: SeaweedS3, bucket: str,
    monkeypatch: pytest.MonkeyPatch, how: str,
) -> None:  # fmt: skip
    """Two signed references give one path different bytes (the newer wins). The older one's
    signed body replayed under a newer name (a new object, or over the newer reference)
    never serves its older bytes: a reference's signature covers its name, so its order."""
    a = _store(tmp_path, "a", run_fxcache, seaweed, bucket, FXCACHE_SIGNING_KEY="k1")
    key = _first_job(a)["scope_key"]
    _in_process_env(monkeypatch, seaweed)
    path = "inductor/fxgraph/rr/shared"
    for n, content in enumerate([b"old" * 500, b"new" * 500]):
        root = _runner_with(a.root, key, tmp_path / f"r{n}", {path: content})
        tier = _tier(bucket)
        _lose_the_head(tier, seaweed, bucket, key)
        got = _publish(tier, root, key, "k1")
        assert got["via"] == "reference", got
        time.sleep(0.01)  # two names, two milliseconds
    (old, old_body), (new, _new_body) = sorted(_refs(seaweed, bucket, key).items())
    name, _ = _bucket_name(bucket)
    s3: Any = seaweed.client()
    if how == "renamed newest":
        stem = old.rsplit("/", 1)[1]
        later = f"{int(time.time() * 1000) + 60_000:013d}{stem[13:]}"
        s3.put_object(Bucket=name, Key=old.rsplit("/", 1)[0] + "/" + later, Body=old_body)
    else:
        s3.put_object(Bucket=name, Key=new, Body=old_body)
    _got, target = _restore_in_process(bucket, tmp_path / "reader", key, "k1")
    served = (target / path).read_bytes() if (target / path).exists() else None
    if how == "renamed newest":
        assert served == b"new" * 500, served
    else:  # the newer reference is gone (overwritten): never its bytes from the older one
        assert served in (None, b"old" * 500)
        from ci_fxcache.store.layout import Layout
        from ci_fxcache.store.remote.s3 import refs

        found = refs.read(_tier(bucket), Layout(tmp_path / "reader3"), key, "k1", refs.MAX_REFS,
                          warn=False)  # fmt: skip
        assert [r.name for r in found.refs] == [old.rsplit("/", 1)[1]], found
        assert new.rsplit("/", 1)[1] in found.ignored, found


@pytest.mark.parametrize("policy", ["max_size", "keep_latest"])
def test_planted_scopes_never_make_a_keyed_clean_up_remove_the_real_one(
    tmp_path: Path, run_fxcache: RunFxcache, seaweed: SeaweedS3, bucket: str,
    monkeypatch: pytest.MonkeyPatch, policy: str,
) -> None:  # fmt: skip
    """Two planted scopes of the same pool, newer than the real one, with unsigned heads
    naming its packs: a keyed clean-up counts the real scope alone (kept under a --max-size
    that fits it, and as the latest of its pool), and lists the planted ones as not counted;
    a keyless one says what it needs the key for."""
    from ci_fxcache.env import scopekey
    from ci_fxcache.store.policies import Policy
    from ci_fxcache.store.remote.s3 import invalidate

    a = _store(tmp_path, "a", run_fxcache, seaweed, bucket, FXCACHE_SIGNING_KEY="k1")
    key = _first_job(a)["scope_key"]
    _in_process_env(monkeypatch, seaweed)
    parsed = scopekey.parse(key)
    assert parsed is not None
    name, prefix = _bucket_name(bucket)
    s3: Any = seaweed.client()
    head = json.loads(s3.get_object(Bucket=name, Key=f"{prefix}/scopes/{key}/head.json")["Body"]
                      .read())  # fmt: skip
    time.sleep(1.1)  # LastModified has seconds
    for n in range(2):
        fake = key.replace(parsed.hash, f"{n:x}" * len(parsed.hash))
        assert fake != key and scopekey.parse(fake) is not None
        planted = {k: v for k, v in head.items() if k != "signature"}
        planted["scope_key"] = fake
        s3.put_object(Bucket=name, Key=f"{prefix}/scopes/{fake}/head.json",
                      Body=json.dumps(planted).encode())  # fmt: skip
    seen = invalidate.run(_tier(bucket), Policy(), dry_run=True, signing_key="k1")
    (size,) = {r["stored_bytes"] for r in seen["scopes"] if r["scope"] == key}
    rules = Policy(max_size=size) if policy == "max_size" else Policy(keep_latest=1)
    done = invalidate.run(_tier(bucket), rules, dry_run=False, signing_key="k1")
    assert done["rows"] == [], done["rows"]
    rows = {r["scope"]: r for r in done["scopes"]}
    assert rows[key]["action"] == "keep" and rows[key]["problem"] is None
    others = [r for k, r in rows.items() if k != key]
    assert len(others) == 2 and all("not signed" in str(r["problem"]) for r in others), others
    got, _ = _restore_in_process(bucket, tmp_path / "reader", key, "k1")
    assert got.files == len(SAMPLE)
    keyless = invalidate.run(_tier(bucket), rules, dry_run=True)
    assert "FXCACHE_SIGNING_KEY" in keyless["gc"]["needs_key"], keyless["gc"]
