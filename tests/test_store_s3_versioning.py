"""A bucket with versioning on (issue 40): the inventory reports what the bucket really
stores (noncurrent versions and delete markers included), and the collection removes the
versions fxcache's saves and deletes left behind. The fixtures and helpers are
test_store_s3.py's."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from ci_fxcache.store.policies import Policy
from ci_fxcache.store.remote.s3 import client as s3_client
from ci_fxcache.store.remote.s3 import invalidate as s3_invalidate
from ci_fxcache.store.remote.s3 import tier as s3_tier
from tests.conftest import RunFxcache
from tests.s3_server import SeaweedS3
from tests.store_helpers import write_files
from tests.test_store_s3 import _compiles_into, _first_job, _save_json, _store
from tests.test_store_s3 import bucket as bucket  # the fixture


def _stored(s3: Any, name: str) -> tuple[int, int, int]:
    """(versions, delete markers, bytes of every version) the bucket really holds."""
    listed = s3.list_object_versions(Bucket=name)
    versions = listed.get("Versions") or []
    return len(versions), len(listed.get("DeleteMarkers") or []), sum(v["Size"] for v in versions)


def _run(store: Any, url: str, **kwargs: Any) -> dict[str, Any]:
    os.environ.update(store.env)
    try:
        return s3_invalidate.run(s3_tier.S3Tier(s3_client.parse_url(url)), **kwargs)
    finally:
        for name in store.env:
            os.environ.pop(name, None)


def test_a_versioned_bucket_is_inventoried_as_stored_and_collected_for_good(
    tmp_path: Path, run_fxcache: RunFxcache, seaweed: SeaweedS3, bucket: str
) -> None:
    s3: Any = seaweed.client()
    name = bucket.removeprefix("s3://").split("/")[0]
    s3.put_bucket_versioning(Bucket=name, VersioningConfiguration={"Status": "Enabled"})
    a = _store(tmp_path, "a", run_fxcache, seaweed, bucket)
    old = _first_job(a)
    write_files(_compiles_into(old), {"inductor/fxgraph/yy/more": b"more" * 999})
    assert _save_json(a)["remote"]["published"]  # the first head is now a noncurrent version
    time.sleep(1.1)  # LastModified has one-second resolution: the second scope is newer
    newer = a.restore("--store", "s3", "--salt", "second", state="s2.json")
    write_files(_compiles_into(newer), {"inductor/fxgraph/zz/other": b"other" * 999})
    assert _save_json(a, "s2.json")["remote"]["published"]
    time.sleep(1.1)  # LastModified has one-second resolution
    policy = Policy(keep_latest=1)
    later = time.time() + s3_invalidate.DEFAULT_GRACE_S + 60  # past the grace period
    dry = _run(a, bucket, policy=policy, dry_run=True, now=later)
    held = dry["bucket"]
    assert held["versioning"] == "Enabled" and held["noncurrent_versions"] >= 1, held
    _versions, markers, _every = _stored(s3, name)
    assert held["noncurrent_bytes"] > 0 and markers == held["delete_markers"] == 0
    assert dry["gc"]["versions_removed"] == held["noncurrent_versions"], dry["gc"]
    done = _run(a, bucket, policy=policy, dry_run=False, now=later)
    assert [r["scope"] for r in done["rows"]] == [old["scope_key"]]
    assert done["gc"]["objects_removed"] >= 2 and done["gc"]["versions_removed"] >= 3, done["gc"]
    _versions, markers, every = _stored(s3, name)
    assert markers == 0, "delete markers left behind"
    assert all(v["IsLatest"] for v in s3.list_object_versions(Bucket=name)["Versions"])
    after = _run(a, bucket, policy=policy, dry_run=True, now=later)["bucket"]
    assert after["noncurrent_versions"] == after["delete_markers"] == 0, after
    heads = sum(o["Size"] for o in s3.list_objects_v2(Bucket=name)["Contents"]
                if "/packs/" not in o["Key"] and "/segments/" not in o["Key"])  # fmt: skip
    assert every == after["bytes"] + heads  # what is stored is what the inventory counts
    c = _store(tmp_path, "c", run_fxcache, seaweed, bucket)
    assert c.restore("--store", "s3", "--salt", "second")["hit"]  # the kept scope is whole
