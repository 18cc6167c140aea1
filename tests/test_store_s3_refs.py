"""`store: s3` with many savers (issue 40 point 3): a save that finds the head changed publishes
its own immutable reference with one attempt; readers merge references (a bad one, under a
key, is left out with a warning and never served); the collection folds them into the head,
drops dead ones and never deletes what one names. Against the real SeaweedFS of the session
(tests/s3_server.py); scopes are a few small files, no compiles."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import RunFxcache
from tests.s3_server import SeaweedS3
from tests.store_helpers import SAMPLE, tree_digest, write_files
from tests.test_store_s3 import _compiles_into, _first_job, _kill_save_before_the_head, _store
from tests.test_store_s3 import bucket as bucket  # the fixture
from tests.test_store_s3_fleet import (
    _bucket_name,
    _committed_copies,
    _in_process_env,
    _keys,
    _plant_segment,
    _restore_in_process,
    _tier,
)


def _refs(seaweed: SeaweedS3, url: str, key: str) -> dict[str, bytes]:
    """Scope `key`'s reference objects: object key -> body."""
    name, prefix = _bucket_name(url)
    s3: Any = seaweed.client()
    listed = s3.list_objects_v2(Bucket=name, Prefix=f"{prefix}/scopes/{key}/refs/")
    return {
        i["Key"]: s3.get_object(Bucket=name, Key=i["Key"])["Body"].read()
        for i in listed.get("Contents") or []
    }


def _lose_the_head(tier: Any, seaweed: SeaweedS3, url: str, key: str) -> None:
    """Make every head PUT of `tier` lose its race: another writer rewrites the head (the
    same JSON and a newline: a new ETag) just before it."""
    real = tier.bucket.put
    name, _ = _bucket_name(url)

    def put(k: str, body: bytes, **kw: Any) -> str:
        if k == tier.head_key(key):
            s3: Any = seaweed.client()
            old = s3.get_object(Bucket=name, Key=k)["Body"].read()
            s3.put_object(Bucket=name, Key=k, Body=old + b"\n")
        return str(real(k, body, **kw))

    tier.bucket.put = put


def _publish(tier: Any, root: Path, key: str, signing_key: str | None = None) -> dict[str, Any]:
    from ci_fxcache.store import manifest as mf
    from ci_fxcache.store.layout import Layout

    layout = Layout(root)
    committed = mf.Committed.read(layout.manifest(key))
    return tier.publish(layout, key, committed, signing_key).to_dict()


def _one_reference(
    tmp_path: Path, run_fxcache: RunFxcache, seaweed: SeaweedS3, bucket: str,
    monkeypatch: pytest.MonkeyPatch, signing_key: str | None,
) -> tuple[str, Path]:  # fmt: skip
    """A scope with a head (SAMPLE) and one reference of a runner's 2 files of its own (its
    head PUT lost a race): the scope key and that runner's root."""
    env = {"FXCACHE_SIGNING_KEY": signing_key} if signing_key else {}
    a = _store(tmp_path, "a", run_fxcache, seaweed, bucket, **env)
    key = _first_job(a)["scope_key"]
    (root,) = _committed_copies(a.root, key, [tmp_path / "b"], 2)
    _in_process_env(monkeypatch, seaweed)
    tier = _tier(bucket)
    _lose_the_head(tier, seaweed, bucket, key)
    got = _publish(tier, root, key, signing_key)
    assert got["published"] and got["via"] == "reference" and got["attempts"] == 1, got
    assert len(_refs(seaweed, bucket, key)) == 1
    return key, root


def test_a_save_that_loses_the_head_publishes_a_reference_that_readers_merge(
    tmp_path: Path, run_fxcache: RunFxcache, seaweed: SeaweedS3, bucket: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """One attempt, no retry: the reference is read by the next restore, and the next save
    folds it into the head and deletes it."""
    key, _root = _one_reference(tmp_path, run_fxcache, seaweed, bucket, monkeypatch, None)
    got, target = _restore_in_process(bucket, tmp_path / "reader", key)
    assert got.files == len(SAMPLE) + 2
    assert {"inductor/fxgraph/r0/e0", "inductor/fxgraph/r0/e1"} <= set(tree_digest(target))
    # Another runner with the same 2 files and one more: it uploads only the one.
    (c_root,) = _committed_copies(tmp_path / "a" / "root", key, [tmp_path / "c"], 3)
    folded = _publish(_tier(bucket), c_root, key)
    assert folded["via"] == "head" and folded["refs_folded"] == 1, folded
    assert folded["uploaded_files"] == 1 and folded["head_files"] == len(SAMPLE) + 3, folded
    assert _refs(seaweed, bucket, key) == {}
    got, _ = _restore_in_process(bucket, tmp_path / "reader2", key)
    assert got.files == len(SAMPLE) + 3


@pytest.mark.parametrize("fault", ["intact", "tampered", "truncated", "unsigned", "other key"])
def test_a_bad_reference_under_a_key_is_left_out_with_a_warning_never_served(
    tmp_path: Path, run_fxcache: RunFxcache, seaweed: SeaweedS3, bucket: str,
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str], fault: str,
) -> None:  # fmt: skip
    from ci_fxcache.store import manifest as mf

    key, _root = _one_reference(tmp_path, run_fxcache, seaweed, bucket, monkeypatch, "k1")
    ((ref_key, body),) = _refs(seaweed, bucket, key).items()
    ref = json.loads(body)
    planted = {"inductor/fxgraph/zz/planted": b"import os  # pickled FX graph of an attacker"}
    if fault == "tampered":  # the signed body, its segments swapped for a planted one
        ref["segments"] = [_plant_segment(seaweed, bucket, planted)]
        body = json.dumps(ref).encode()
    elif fault == "truncated":
        body = body[: len(body) // 2]
    elif fault == "unsigned":
        ref["segments"].append(_plant_segment(seaweed, bucket, planted))
        ref.pop("signature")
        body = json.dumps(ref).encode()
    elif fault == "other key":
        ref["segments"].append(_plant_segment(seaweed, bucket, planted))
        ref.pop("signature")
        mf.sign(ref, "k2")
        body = json.dumps(ref).encode()
    name, _ = _bucket_name(bucket)
    s3: Any = seaweed.client()
    s3.put_object(Bucket=name, Key=ref_key, Body=body)
    capfd.readouterr()
    got, target = _restore_in_process(bucket, tmp_path / "reader", key, "k1")
    names = set(tree_digest(target))
    warned = "left out, never served" in capfd.readouterr().err
    assert "inductor/fxgraph/zz/planted" not in names
    if fault == "intact":
        assert got.files == len(SAMPLE) + 2 and not warned
    else:
        assert got.files == len(SAMPLE) and warned, (got, fault)
        assert "inductor/fxgraph/r0/e0" not in names


def test_a_saver_killed_between_its_packs_and_its_reference_leaves_nothing_visible(
    tmp_path: Path, run_fxcache: RunFxcache, seaweed: SeaweedS3, bucket: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """Killed after its packs and segment (the `s3-pause` fault): no head change, no
    reference; the collection keeps the orphans within the grace and removes them after it."""
    from ci_fxcache.store.policies import Policy
    from ci_fxcache.store.remote.s3 import invalidate

    a = _store(tmp_path, "a", run_fxcache, seaweed, bucket)
    key = _first_job(a)["scope_key"]
    state = a.restore("--store", "s3")
    before = _keys(seaweed, bucket)
    write_files(_compiles_into(state), {"inductor/fxgraph/kk/killed": b"k" * 4000})
    _kill_save_before_the_head(a)
    orphans = set(_keys(seaweed, bucket)) - set(before)
    assert orphans and not any("/scopes/" in k for k in orphans), orphans
    assert _refs(seaweed, bucket, key) == {}
    _in_process_env(monkeypatch, seaweed)
    got, _ = _restore_in_process(bucket, tmp_path / "reader", key)
    assert got.files == len(SAMPLE)
    kept = invalidate.run(_tier(bucket), Policy(), dry_run=False)["gc"]
    assert kept["objects_removed"] == 0 and kept["kept_in_grace"] == len(orphans), kept
    later = time.time() + invalidate.DEFAULT_GRACE_S + 3600
    done = invalidate.run(_tier(bucket), Policy(), dry_run=False, now=later)["gc"]
    assert done["objects_removed"] == len(orphans), done
    assert set(_keys(seaweed, bucket)) == set(before)
    got, _ = _restore_in_process(bucket, tmp_path / "reader2", key)
    assert got.files == len(SAMPLE)


SAVERS = 12


def test_the_collection_racing_savers_loses_no_references_files(
    tmp_path: Path, run_fxcache: RunFxcache, seaweed: SeaweedS3, bucket: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """12 runners publish at once (each with one attempt) while the collection folds and
    collects in a loop; then one more collection, and one as if the grace had passed: every
    file of every runner is restored, and no reference is left."""
    from ci_fxcache.store.policies import Policy
    from ci_fxcache.store.remote.s3 import invalidate

    a = _store(tmp_path, "a", run_fxcache, seaweed, bucket)
    key = _first_job(a)["scope_key"]
    roots = _committed_copies(a.root, key, [tmp_path / f"r{n}" for n in range(SAVERS)], 2)
    # Each save pauses 1 s between its packs and its head or reference: the collections
    # run inside that window.
    _in_process_env(monkeypatch, seaweed, FXCACHE_TEST_FAULT="s3-pause:1")
    tiers = [_tier(bucket) for _ in roots]
    for tier in tiers:
        tier.bucket.listing(tier.where.key("scopes"))  # clients made, credentials read
    barrier = threading.Barrier(SAVERS + 1)
    results: dict[int, dict[str, Any]] = {}
    done = threading.Event()
    gcs: list[dict[str, Any]] = []

    def save(n: int) -> None:
        barrier.wait()
        results[n] = _publish(tiers[n], roots[n], key)

    def collect() -> None:
        barrier.wait()
        while not done.is_set():
            gcs.append(invalidate.run(_tier(bucket), Policy(), dry_run=False)["gc"])

    workers = [threading.Thread(target=save, args=(n,)) for n in range(SAVERS)]
    gc_thread = threading.Thread(target=collect)
    for worker in [*workers, gc_thread]:
        worker.start()
    for worker in workers:
        worker.join()
    done.set()
    gc_thread.join()
    assert {r["attempts"] for r in results.values()} == {1}, results
    assert all(r["published"] for r in results.values()), results
    invalidate.run(_tier(bucket), Policy(), dry_run=False)
    monkeypatch.delenv("FXCACHE_TEST_FAULT")
    later = time.time() + invalidate.DEFAULT_GRACE_S + 3600
    invalidate.run(_tier(bucket), Policy(), dry_run=False, now=later)
    assert _refs(seaweed, bucket, key) == {}
    got, target = _restore_in_process(bucket, tmp_path / "reader", key)
    expected = {f"inductor/fxgraph/r{n}/e{i}" for n in range(SAVERS) for i in range(2)}
    assert expected <= set(tree_digest(target))
    assert got.files == len(SAMPLE) + 2 * SAVERS
    vias = [r["via"] for r in results.values()]
    print(f"{SAVERS} savers: {vias.count('head')} by the head, {vias.count('reference')} by "
          f"a reference; {len(gcs)} collections ran meanwhile")  # fmt: skip


def test_the_inventory_counts_references_and_the_collection_drops_dead_ones(
    tmp_path: Path, run_fxcache: RunFxcache, seaweed: SeaweedS3, bucket: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """A reference's packs and segments count in its scope's stored bytes and are never
    collected; once its pack is gone and it is older than the grace, the reference is
    dropped (never folded into the head)."""
    from ci_fxcache.store.policies import Policy
    from ci_fxcache.store.remote.s3 import invalidate

    key, _root = _one_reference(tmp_path, run_fxcache, seaweed, bucket, monkeypatch, None)
    listed = _keys(seaweed, bucket)
    data = {k: i for k, i in listed.items() if "/scopes/" not in k}
    later = time.time() + invalidate.DEFAULT_GRACE_S + 3600
    seen = invalidate.run(_tier(bucket), Policy(), dry_run=True, now=later)
    assert seen["bucket"]["references"] == 1
    (row,) = seen["scopes"]
    assert row["stored_bytes"] == sum(i["Size"] for i in data.values()), row
    assert seen["gc"]["objects_removed"] == 0 and seen["gc"]["refs_dropped"] == 0, seen["gc"]
    ref_packs = set(data) - {k for k in data if "/segments/" in k}
    head = json.loads(
        seaweed_get(seaweed, bucket, f"scopes/{key}/head.json")  # the head names SAMPLE's
    )
    mine = {p for p in ref_packs if p.rsplit("/", 1)[1] not in
            {q for s in head["segments"] for q in s["packs"]}}  # fmt: skip
    assert len(mine) == 1, mine
    seaweed.damage(bucket, mine.pop(), "delete")
    done = invalidate.run(_tier(bucket), Policy(), dry_run=False, now=later)
    assert done["gc"]["refs_dropped"] == 1 and done["gc"]["refs_folded"] == 0, done["gc"]
    assert _refs(seaweed, bucket, key) == {}
    got, _ = _restore_in_process(bucket, tmp_path / "reader", key)
    assert got.files == len(SAMPLE)


def seaweed_get(seaweed: SeaweedS3, url: str, rel: str) -> bytes:
    name, prefix = _bucket_name(url)
    s3: Any = seaweed.client()
    body: bytes = s3.get_object(Bucket=name, Key=f"{prefix}/{rel}")["Body"].read()
    return body


def test_the_collection_folds_signed_references_only_with_the_key(
    tmp_path: Path, run_fxcache: RunFxcache, seaweed: SeaweedS3, bucket: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """Without the key a fold would write an unsigned head that keyed readers refuse: the
    reference stays (and keeps its objects); with the key it is folded into a signed head."""
    from ci_fxcache.store.policies import Policy
    from ci_fxcache.store.remote.s3 import invalidate

    key, _root = _one_reference(tmp_path, run_fxcache, seaweed, bucket, monkeypatch, "k1")
    keyless = invalidate.run(_tier(bucket), Policy(), dry_run=False)["gc"]
    assert keyless["refs_folded"] == 0 and "FXCACHE_SIGNING_KEY" in keyless["refs_unfolded"][key], (
        keyless
    )
    assert len(_refs(seaweed, bucket, key)) == 1
    keyed = invalidate.run(_tier(bucket), Policy(), dry_run=False, signing_key="k1")["gc"]
    assert keyed["refs_folded"] == 1 and keyed["refs_unfolded"] == {}, keyed
    assert _refs(seaweed, bucket, key) == {}
    head = json.loads(seaweed_get(seaweed, bucket, f"scopes/{key}/head.json"))
    assert "signature" in head and head["files"] == len(SAMPLE) + 2, head
    got, _ = _restore_in_process(bucket, tmp_path / "reader", key, "k1")
    assert got.files == len(SAMPLE) + 2


def test_a_save_folds_few_or_stale_references_and_a_burst_only_by_chance(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Up to FOLD_READS references, or a backlog older than FOLD_STALE_S, a save reads and
    folds them; past that, only when its draw (FOLD_READS in n) says so."""
    from ci_fxcache.store.remote.s3 import refs

    now = int(time.time() * 1000)
    fresh = [f"{now - i:013d}-{i:016x}" for i in range(1000)][::-1]
    assert refs.folds(fresh[: refs.FOLD_READS])
    stale = [f"{now - int(refs.FOLD_STALE_S * 1000) - 1000:013d}-{0:016x}", *fresh]
    draws: list[int] = []

    def last(n: int) -> int:  # the draw that never folds
        draws.append(n)
        return n - 1

    monkeypatch.setattr(refs.secrets, "randbelow", last)
    assert refs.folds(stale) and draws == []
    assert not refs.folds(fresh) and draws == [1000]
    monkeypatch.setattr(refs.secrets, "randbelow", lambda n: refs.FOLD_READS - 1)
    assert refs.folds(fresh)
