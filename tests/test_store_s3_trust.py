"""Keyed jobs (FXCACHE_SIGNING_KEY) with `store: s3` against what a key-less writer of the
runner's store can do between the steps of a job: a real SeaweedFS, the real CLI as jobs run
it, faults injected on disk as a co-tenant would (issue 39)."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import RunFxcache
from tests.s3_server import SeaweedS3
from tests.store_helpers import SAMPLE, tree_digest, write_files
from tests.test_store_s3 import _compiles_into, _kill_save_before_the_head, _store
from tests.test_store_s3 import bucket as bucket  # the fixture

KEY = "fleet-key-1"
PLANTED = "inductor/fxgraph/zz/planted"
PLANTED_BYTES = b"not compiled by any keyed job" * 40


def _writable(path: Path) -> None:
    """What a co-tenant with the runner's user does first: give itself write permission."""
    os.chmod(path, os.stat(path).st_mode | 0o700)


def _swap_manifest(scope: Path) -> None:
    """Plant a file in committed scope `scope` and swap its manifest for one that lists it
    (unsigned: the swapper has no key), renamed into place as a save would."""
    for directory in (scope, scope / "inductor", scope / "inductor" / "fxgraph"):
        _writable(directory)
    write_files(scope, {PLANTED: PLANTED_BYTES})
    manifest = json.loads((scope / "manifest.json").read_text())
    manifest["files"][PLANTED] = {
        "sha256": hashlib.sha256(PLANTED_BYTES).hexdigest(),
        "size": len(PLANTED_BYTES),
        "mtime_ns": os.stat(scope / PLANTED).st_mtime_ns,
    }
    manifest["total_bytes"] += len(PLANTED_BYTES)
    manifest.pop("signature", None)
    swapped = scope / "manifest.json.swap"
    swapped.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    os.replace(swapped, scope / "manifest.json")


def _save_stopped_before_publish(env: dict[str, str], state: Path) -> subprocess.Popen[str]:
    """`fxcache save --json`, stopped by the `stop-before-publish` test fault once its
    manifest is committed and its lock released, before its publish."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "ci_fxcache", "save", "--json", "--state-file", str(state)],
        env={**os.environ, **env, "FXCACHE_TEST_FAULT": "stop-before-publish"},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert "stopped before the publish" in line, (line, proc.stderr and proc.stderr.read())
    _pid, status = os.waitpid(proc.pid, os.WUNTRACED)  # returns once it has stopped itself
    assert os.WIFSTOPPED(status), status
    return proc


def test_a_manifest_swapped_between_a_keyed_save_and_its_publish_never_reaches_the_bucket(
    tmp_path: Path, run_fxcache: RunFxcache, seaweed: SeaweedS3, bucket: str
) -> None:
    """Defect 1 of issue 39: the publish sends the manifest its save checked and signed under
    the lock. A key-less co-tenant swaps manifest.json (and plants a file) the moment the
    save has committed: the signed head lists only the job's own files, and an empty keyed
    runner restores exactly those."""
    a = _store(tmp_path, "a", run_fxcache, seaweed, bucket, FXCACHE_SIGNING_KEY=KEY)
    state = a.restore("--store", "s3")
    assert state["remote"]["found"] is False, state
    write_files(_compiles_into(state), SAMPLE)
    proc = _save_stopped_before_publish(a.env, a.root.parent / "state.json")
    try:
        _swap_manifest(a.root / state["scope_key"])
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    out, err = proc.communicate()
    assert proc.returncode == 0, err
    saved: dict[str, Any] = json.loads(out)
    assert saved["saved"] and saved["signed"] and saved["remote"]["published"], saved

    c = _store(tmp_path, "c", run_fxcache, seaweed, bucket, FXCACHE_SIGNING_KEY=KEY)
    got = c.restore("--store", "s3")
    assert got["hit"] and got["signature_checked"] and got["remote"]["fetched"], got
    restored = tree_digest(c.root / got["scope_key"])
    assert PLANTED not in restored
    assert {rel for rel in restored if rel.startswith(("inductor/", "triton/"))} == set(SAMPLE)
    assert saved["remote"]["head_files"] == len(SAMPLE), saved


PR_FILES = {
    "inductor/fxgraph/pr/entry": b"compiled by a pull request's branch" * 30,
    "triton/PRKERNEL/kernel.so": b"a pull request's kernel" * 30,
}


def test_a_read_only_runs_commits_never_reach_the_bucket_nor_a_later_keyed_job(
    tmp_path: Path, run_fxcache: RunFxcache, seaweed: SeaweedS3, bucket: str
) -> None:
    """Defect 2 of issue 39: a run that may read the bucket but not write it (a pull
    request's under `save: auto`, here with the fleet's key, as a same-repository pull
    request has it) commits on a persistent runner; the next writing run on that runner
    neither is served its files nor publishes them, and an empty keyed runner restores only
    the writer's own."""
    runner = _store(tmp_path, "a", run_fxcache, seaweed, bucket, FXCACHE_SIGNING_KEY=KEY)
    pr = runner.restore("--store", "s3", "--remote-read-only")
    write_files(_compiles_into(pr), PR_FILES)
    kept = json.loads(runner.save().stdout)
    assert kept["saved"] and kept["signed"] and kept["files"] == len(PR_FILES), kept
    assert "remote" not in kept, kept  # the read-only run wrote nothing to the bucket

    push = runner.restore("--store", "s3")
    assert push["scope_key"] == pr["scope_key"]
    assert not push["hit"] and push["files"] == 0, push  # not served the pull request's files
    served = tree_digest(push["scope_dir"])
    assert not set(PR_FILES) & set(served), served
    write_files(_compiles_into(push), SAMPLE)
    saved = json.loads(runner.save().stdout)
    assert saved["saved"] and saved["remote"]["published"], saved
    assert saved["files"] == len(SAMPLE) and saved["remote"]["head_files"] == len(SAMPLE), saved

    c = _store(tmp_path, "c", run_fxcache, seaweed, bucket, FXCACHE_SIGNING_KEY=KEY)
    got = c.restore("--store", "s3")
    assert got["hit"] and got["signature_checked"] and got["remote"]["fetched"], got
    restored = tree_digest(c.root / got["scope_key"])
    assert {rel for rel in restored if rel.startswith(("inductor/", "triton/"))} == set(SAMPLE)

    # The pull request's next run on this runner still has its own files (its namespace).
    again = runner.restore("--store", "s3", "--remote-read-only")
    assert again["hit"] and set(PR_FILES) <= set(tree_digest(again["scope_dir"])), again


def _plant_sent_records(root: Path, bucket_url: str, key: str, files: dict[str, bytes]) -> None:
    """What a key-less writer of the runner's store can write: a record of a pack "this
    runner uploaded" for scope `key`, naming a pack the bucket does not have, with the right
    sha256 and size of each of `files` (so a save that trusts it reuses it)."""
    from ci_fxcache.store.layout import Layout
    from ci_fxcache.store.remote import packs
    from ci_fxcache.store.remote.s3 import client, tier

    made = root.parent / "planted"
    write_files(made, files)
    entries = {
        rel: {"sha256": hashlib.sha256(b).hexdigest(), "size": len(b)} for rel, b in files.items()
    }
    _blob, placed = packs.build(made, sorted(files), entries)
    elsewhere = hashlib.sha256(b"a pack nobody uploaded").hexdigest()
    tier.S3Tier(client.parse_url(bucket_url)).record_sent(Layout(root), key, elsewhere, placed)


def test_a_keyed_save_never_signs_a_head_from_sent_records_a_keyless_writer_planted(
    tmp_path: Path, run_fxcache: RunFxcache, seaweed: SeaweedS3, bucket: str
) -> None:
    """Lows of issue 39: the runner's records of the packs it sent are any local writer's to
    rewrite. A keyed save reuses only records whose MAC its key verifies: a planted record
    that names a pack the bucket lacks never reaches the signed head (the fleet would go
    cold), while the keyed save's own records are still reused after a killed save."""
    a = _store(tmp_path, "a", run_fxcache, seaweed, bucket, FXCACHE_SIGNING_KEY=KEY)
    state = a.restore("--store", "s3")
    write_files(_compiles_into(state), SAMPLE)
    _plant_sent_records(a.root, bucket, state["scope_key"], SAMPLE)
    saved = json.loads(a.save().stdout)
    assert saved["remote"]["published"] and saved["remote"]["reused_orphans"] == 0, saved
    c = _store(tmp_path, "c", run_fxcache, seaweed, bucket, FXCACHE_SIGNING_KEY=KEY)
    got = c.restore("--store", "s3")
    assert got["hit"] and got["files"] == len(SAMPLE) and got["remote"]["fetched"], got


def test_a_keyed_save_still_reuses_the_packs_its_killed_predecessor_sent(
    tmp_path: Path, run_fxcache: RunFxcache, seaweed: SeaweedS3, bucket: str
) -> None:
    a = _store(tmp_path, "a", run_fxcache, seaweed, bucket, FXCACHE_SIGNING_KEY=KEY)
    state = a.restore("--store", "s3")
    write_files(_compiles_into(state), SAMPLE)
    _kill_save_before_the_head(a)
    a.restore("--store", "s3")  # the runner's next keyed job: its save completes the publish
    done = json.loads(a.save().stdout)["remote"]
    assert done["published"] and done["reused_orphans"] >= 1, done
    assert done["uploaded_files"] == 0, done
    c = _store(tmp_path, "c", run_fxcache, seaweed, bucket, FXCACHE_SIGNING_KEY=KEY)
    got = c.restore("--store", "s3")
    assert got["hit"] and got["files"] == len(SAMPLE), got


def test_an_unchanged_object_is_told_by_its_status_never_by_a_message(
    monkeypatch: pytest.MonkeyPatch, seaweed: SeaweedS3, bucket: str
) -> None:
    """Issue 39 (errors told apart by type): a conditional GET of an object whose ETag has
    not changed is a 304 that the client turns into S3NotModified, never recognised by
    botocore's wording."""
    from ci_fxcache.store.remote.s3 import client

    for name, value in seaweed.env().items():
        monkeypatch.setenv(name, value)
    where = client.parse_url(bucket)
    objects = client.Bucket(where)
    objects.put("fleet/ci/probe", b"unchanged")
    body, etag = objects.get("fleet/ci/probe", limit=100) or (b"", "")
    assert body == b"unchanged" and etag
    assert objects.get("fleet/ci/probe", if_none_match=etag, limit=100) is None
    assert objects.get("fleet/ci/probe", if_none_match='"other"', limit=100) == (body, etag)
