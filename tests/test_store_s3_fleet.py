"""`store: s3` as a fleet uses it (issue 31 points 3-5 and 8, issue 32's S3 signing): one time
bound per operation, many writers, hung endpoints, whatever is in the bucket, inventory.
Against the real SeaweedFS of the session (tests/s3_server.py) and real misbehaving endpoints
(tests/stalling_server.py); scopes are a few small files, no compiles."""

from __future__ import annotations

import fcntl
import gzip
import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import TORCH_PYTHON, RunFxcache, torch_build
from tests.link_proxy import Link
from tests.s3_server import SeaweedS3
from tests.stalling_server import StallingServer
from tests.store_helpers import SAMPLE, end_lease_holders, tree_digest, write_files
from tests.test_store_s3 import (
    _compiles_into,
    _first_job,
    _kill_save_before_the_head,
    _save_json,
    _store,
)
from tests.test_store_s3 import bucket as bucket  # the fixture


def _in_process_env(monkeypatch: pytest.MonkeyPatch, seaweed: SeaweedS3, **extra: str) -> None:
    for name, value in {**seaweed.env(), **extra}.items():
        monkeypatch.setenv(name, value)


# -- one time bound per operation ------------------------------------------------------------


def test_a_server_that_freezes_mid_body_costs_the_time_bound_not_the_read_timeouts(
    monkeypatch: pytest.MonkeyPatch, seaweed: SeaweedS3
) -> None:
    """The server sends the headers and a quarter of the body, then nothing: with per-request
    timeouts of 600 s (x3 attempts) only the operation's bound (2 s) ends the wait."""
    from ci_fxcache.store.remote.s3.client import Bucket, S3Unavailable, parse_url

    with StallingServer("freeze-body") as server:
        _in_process_env(monkeypatch, seaweed, AWS_ENDPOINT_URL_S3=server.endpoint,
                        FXCACHE_S3_TIMEOUT="600", FXCACHE_S3_DEADLINE="2")  # fmt: skip
        bucket = Bucket(parse_url("s3://frozen-bucket/x"))
        outcome: list[BaseException | None] = []

        def get() -> None:
            try:
                bucket.get("x/packs/one", limit=1 << 30)
                outcome.append(None)
            except BaseException as exc:
                outcome.append(exc)

        worker = threading.Thread(target=get, daemon=True)
        worker.start()
        worker.join(300)  # far below one read timeout: only the bound can end it
        assert outcome, "the GET still waits on the frozen body"
        assert isinstance(outcome[0], S3Unavailable), outcome
        assert "time bound" in str(outcome[0]) and "FXCACHE_S3_DEADLINE" in str(outcome[0])
        assert server.requests == 1  # the body froze: no retry after the bound either
        assert bucket.requests == {"get_object": 1}


@pytest.mark.parametrize(
    "setting", ["FXCACHE_S3_TIMEOUT=abc", "FXCACHE_S3_DEADLINE=0", "FXCACHE_S3_DEADLINE=9999"]
)
def test_malformed_s3_settings_are_usage_errors_before_the_local_commit(
    tmp_path: Path, run_fxcache: RunFxcache, seaweed: SeaweedS3, bucket: str, setting: str
) -> None:
    name, _, value = setting.partition("=")
    a = _store(tmp_path, "a", run_fxcache, seaweed, bucket)
    state = a.restore("--store", "s3")
    write_files(_compiles_into(state), SAMPLE)
    proc = a.save(env={name: value})
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    (line,) = [x for x in proc.stderr.splitlines() if x.strip()]
    assert name in line, line
    assert not (Path(state["scope_dir"]) / "manifest.json").exists()  # nothing committed
    refused = a.run("restore", "--store", "s3", "--root", str(a.root), "--json",
                    env={**a.env, name: value})  # fmt: skip
    assert refused.returncode == 2 and name in refused.stderr, refused.stderr
    saved = _save_json(a)  # fixed: the save commits and publishes
    assert saved["saved"] and saved["remote"]["published"], saved


def test_invalidate_s3_against_an_unreachable_endpoint_is_not_a_usage_error(
    tmp_path: Path, run_fxcache: RunFxcache, seaweed: SeaweedS3, bucket: str
) -> None:
    with StallingServer("silent") as server:
        env = {**seaweed.env(), "FXCACHE_S3_URL": bucket, "AWS_ENDPOINT_URL_S3": server.endpoint,
               "FXCACHE_S3_DEADLINE": "2"}  # fmt: skip
        proc = run_fxcache("invalidate", "--s3", "--max-age", "14d", "--json", env=env)
    assert proc.returncode == 1, (proc.returncode, proc.stderr)
    assert "time bound" in proc.stderr and proc.stdout == "", proc.stderr


# -- helpers ---------------------------------------------------------------------------------


def _warnings(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "warning" in line]


def _bucket_name(url: str) -> tuple[str, str]:
    name, _, prefix = url.removeprefix("s3://").partition("/")
    return name, prefix


def _head(seaweed: SeaweedS3, url: str, key: str) -> dict[str, Any]:
    name, prefix = _bucket_name(url)
    s3: Any = seaweed.client()
    body = s3.get_object(Bucket=name, Key=f"{prefix}/scopes/{key}/head.json")["Body"].read()
    data: dict[str, Any] = json.loads(body)
    return data


def _put(seaweed: SeaweedS3, url: str, rel: str, body: bytes) -> None:
    name, prefix = _bucket_name(url)
    s3: Any = seaweed.client()
    s3.put_object(Bucket=name, Key=f"{prefix}/{rel}", Body=body)


def _keys(seaweed: SeaweedS3, url: str) -> dict[str, dict[str, Any]]:
    """Key -> listing item of every object under the URL's bucket."""
    name, _ = _bucket_name(url)
    s3: Any = seaweed.client()
    return {i["Key"]: i for i in s3.list_objects_v2(Bucket=name).get("Contents") or []}


def _plant_segment(seaweed: SeaweedS3, url: str, files: dict[str, bytes]) -> dict[str, Any]:
    """Upload a pack and a segment naming `files` (what a writer without the key can do);
    the head's reference to the segment."""
    blob = b"".join(files.values())
    pack = hashlib.sha256(blob).hexdigest()
    _put(seaweed, url, f"packs/{pack}", blob)
    entries, offset = {}, 0
    for rel, body in files.items():
        entries[rel] = {"sha256": hashlib.sha256(body).hexdigest(), "size": len(body),
                        "offset": offset, "pack": pack}  # fmt: skip
        offset += len(body)
    raw = gzip.compress(json.dumps({"schema": "fxcache-s3-segment/1", "files": entries}).encode())
    digest = hashlib.sha256(raw).hexdigest()
    _put(seaweed, url, f"segments/{digest}", raw)
    return {"sha256": digest, "files": len(files), "packs": [pack]}


def _tier(url: str) -> Any:
    from ci_fxcache.store.remote.s3 import client as s3_client
    from ci_fxcache.store.remote.s3 import tier as s3_tier

    return s3_tier.S3Tier(s3_client.parse_url(url))


def _committed_copies(src: Path, key: str, roots: list[Path], extra: int) -> list[Path]:
    """Runner roots that each hold scope `key` of store `src` committed, plus `extra` files
    of their own (as a save leaves them): many runners without a CLI run each."""
    from ci_fxcache.store import manifest as mf
    from ci_fxcache.store.layout import Layout

    base = mf.load(Layout(src).manifest(key))
    for n, root in enumerate(roots):
        layout = Layout(root)
        shutil.copytree(src / key, layout.scope(key), symlinks=True)
        write_files(layout.scope(key), {f"inductor/fxgraph/r{n}/e{i}": f"{n}-{i}".encode() * 300
                                         for i in range(extra)})  # fmt: skip
        found, problems = mf.scan(layout.scope(key))
        assert problems == []
        files = mf.file_entries(layout.scope(key), found)
        manifest = {**base, "files": files, "total_bytes": sum(m["size"] for m in files.values())}
        (root / ".locks").mkdir(exist_ok=True)
        mf.write_atomic(layout.manifest(key), manifest, root / ".locks")
    return roots


def _restore_in_process(url: str, root: Path, key: str, signing_key: str | None = None) -> Any:
    from ci_fxcache.store.layout import Layout

    layout = Layout(root)
    (root / ".remote").mkdir(parents=True, exist_ok=True)
    target = root / ".remote" / f"fetch-check-{uuid.uuid4().hex[:8]}"
    got = _tier(url).fetch(layout, key, target, signing_key)
    return got, target


# -- signing: a keyed save extends only a head signed with its key (issue 32) -----------------


@pytest.mark.parametrize("when", ["before the save", "during the save"])
def test_a_keyed_save_never_signs_segments_of_an_unsigned_head(
    tmp_path: Path, run_fxcache: RunFxcache, seaweed: SeaweedS3, bucket: str, when: str
) -> None:
    """A writer without the key plants an unsigned head naming an extra segment of pickled
    entries (here: planted bytes); the next keyed save starts fresh from its own verified
    files and warns; a keyed reader never sees the planted entries."""
    a = _store(tmp_path, "a", run_fxcache, seaweed, bucket, FXCACHE_SIGNING_KEY="k1")
    key = _first_job(a)["scope_key"]
    planted = {"inductor/fxgraph/zz/planted": b"import os  # pickled FX graph of an attacker"}

    def plant() -> str:
        head = _head(seaweed, bucket, key)
        extra = _plant_segment(seaweed, bucket, planted)
        head.pop("signature")
        head["segments"].append(extra)
        head["files"] += 1
        _put(seaweed, bucket, f"scopes/{key}/head.json", json.dumps(head).encode())
        return str(extra["sha256"])

    new = {"inductor/fxgraph/ne/new-entry": b"new" * 500}
    state = a.restore("--store", "s3", state="s2.json")
    write_files(_compiles_into(state), new)
    if when == "before the save":
        extra = plant()
        saved = _save_json(a, "s2.json")
    else:  # the save read the signed head, then loses the race to the unsigned one
        held = subprocess.Popen(
            [sys.executable, "-m", "ci_fxcache", "save", "--json", "--state-file",
             str(a.root.parent / "s2.json")],
            env={**os.environ, **a.env, "FXCACHE_TEST_FAULT": "s3-pause:3"},
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert held.stdout is not None
        assert "pausing before the head" in held.stdout.readline()
        extra = plant()
        out, err = held.communicate(timeout=300)
        assert held.returncode == 0, err
        lost = json.loads(out)["remote"]
        # One attempt: the head changed, so the save published its own signed reference
        # (never a head over the unsigned one); the next keyed save replaces the head.
        assert lost["published"] and lost["via"] == "reference" and lost["attempts"] == 1, lost
        a.restore("--store", "s3", state="s3.json")
        saved = _save_json(a, "s3.json")
    assert saved["remote"]["published"], saved["remote"]
    head = _head(seaweed, bucket, key)
    assert extra not in {s["sha256"] for s in head["segments"]}, head
    c = _store(tmp_path, "c", run_fxcache, seaweed, bucket, FXCACHE_SIGNING_KEY="k1")
    got = c.restore("--store", "s3")
    names = tree_digest(Path(got["scope_dir"]))
    assert "inductor/fxgraph/zz/planted" not in names and set(new) <= set(names)
    assert got["hit"] and got["signed"] and got["files"] == len(SAMPLE) + len(new), got
    assert head["files"] == len(SAMPLE) + len(new) and "signature" in head
    assert "not signed" in saved["remote"]["replaced"], saved["remote"]
    assert any("replaced by this job's own files" in w for w in _warnings(saved["_stderr"]))


# -- robust to whatever is in the bucket ------------------------------------------------------


@pytest.mark.parametrize(
    "damage",
    ["segment files not an integer", "total_bytes a string", "not JSON", "unknown field"],
)
def test_a_bad_head_is_refused_by_restore_and_replaced_by_the_next_save(
    tmp_path: Path, run_fxcache: RunFxcache, seaweed: SeaweedS3, bucket: str, damage: str
) -> None:
    a = _store(tmp_path, "a", run_fxcache, seaweed, bucket)
    key = _first_job(a)["scope_key"]
    head = _head(seaweed, bucket, key)
    if damage == "segment files not an integer":
        head["segments"][0]["files"] = "many"
    elif damage == "total_bytes a string":
        head["total_bytes"] = "1e9"
    elif damage == "unknown field":
        head["run_this"] = "os.system"
    body = b"{not json" if damage == "not JSON" else json.dumps(head).encode()
    _put(seaweed, bucket, f"scopes/{key}/head.json", body)
    b = _store(tmp_path, "b", run_fxcache, seaweed, bucket)
    refused = b.restore("--store", "s3")
    assert not refused["hit"] and refused["remote"]["error"], refused["remote"]
    for runner in (a, b):  # every later save of the scope, on every runner
        state = runner.restore("--store", "s3", state="s2.json")
        write_files(_compiles_into(state), {f"inductor/fxgraph/zz/{runner.root.parent.name}": b"z"})
        proc = runner.save("s2.json")
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
        assert json.loads(proc.stdout)["remote"]["published"], proc.stdout
    c = _store(tmp_path, "c", run_fxcache, seaweed, bucket)
    got = c.restore("--store", "s3")
    assert got["hit"] and got["remote"]["fetched"] and got["files"] >= len(SAMPLE), got


def test_the_heads_file_count_and_bytes_are_the_whole_scopes(
    tmp_path: Path, run_fxcache: RunFxcache, seaweed: SeaweedS3, bucket: str
) -> None:
    """Two runners add different files: the head counts both runners' files (each runner's
    local manifest knows only its own)."""
    a = _store(tmp_path, "a", run_fxcache, seaweed, bucket)
    key = _first_job(a)["scope_key"]
    b = _store(tmp_path, "b", run_fxcache, seaweed, bucket)
    big = {"inductor/fxgraph/bb/big": os.urandom(50_000)}
    state = b.restore("--store", "s3")
    write_files(_compiles_into(state), big)
    assert _save_json(b)["remote"]["published"]
    mine = {"inductor/fxgraph/aa/mine": b"m" * 7000}
    state = a.restore("--store", "s3", "--salt", "x", state="s2.json")  # another scope: no hit
    a.restore("--store", "s3", state="s3.json")
    write_files(_compiles_into(json.loads((a.root.parent / "s3.json").read_text())), mine)
    assert _save_json(a, "s3.json")["remote"]["published"]
    head = _head(seaweed, bucket, key)
    every = {**SAMPLE, **big, **mine}
    assert head["files"] == len(every), head
    assert head["total_bytes"] == sum(len(v) for v in every.values()), head


# -- many writers ----------------------------------------------------------------------------

SAVERS = 24


def test_24_runners_saving_one_scope_at_once_lose_no_file(
    tmp_path: Path, run_fxcache: RunFxcache, seaweed: SeaweedS3, bucket: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """24 runners, each with the scope committed plus 2 files of its own, publish at once
    (the real publish path, one client each, a barrier before the first request): every file
    reaches the bucket, each save with one attempt (the head, else its own reference)."""
    from ci_fxcache.store import manifest as mf
    from ci_fxcache.store.layout import Layout

    a = _store(tmp_path, "a", run_fxcache, seaweed, bucket)
    key = _first_job(a)["scope_key"]
    roots = _committed_copies(a.root, key, [tmp_path / f"r{n}" for n in range(SAVERS)], 2)
    _in_process_env(monkeypatch, seaweed)
    tiers = [_tier(bucket) for _ in roots]
    for tier in tiers:
        tier.bucket.listing(tier.where.key("scopes"))  # clients made, credentials read
    barrier = threading.Barrier(SAVERS)
    results: dict[int, dict[str, Any]] = {}

    def save(n: int) -> None:
        barrier.wait()
        try:
            layout = Layout(roots[n])
            committed = mf.Committed.read(layout.manifest(key))
            results[n] = tiers[n].publish(layout, key, committed, None).to_dict()
        except Exception as exc:  # RemoteUnavailable: the save says it did not publish
            results[n] = {"published": False, "error": str(exc)}

    workers = [threading.Thread(target=save, args=(n,)) for n in range(SAVERS)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    said_no = [n for n, r in results.items() if not r.get("published")]
    for n in said_no:  # the next save on that runner publishes what it kept
        layout = Layout(roots[n])
        committed = mf.Committed.read(layout.manifest(key))
        assert _tier(bucket).publish(layout, key, committed, None).published, n
    got, target = _restore_in_process(bucket, tmp_path / "reader", key)
    names = set(tree_digest(target))
    expected = {f"inductor/fxgraph/r{n}/e{i}" for n in range(SAVERS) for i in range(2)}
    assert expected <= names, sorted(expected - names)[:5]
    assert got.files == len(SAMPLE) + 2 * SAVERS
    attempts = sorted(r.get("attempts", 0) for r in results.values())
    print(f"{SAVERS} savers: {len(said_no)} said they did not publish; attempts {attempts}")
    assert said_no == [], {n: results[n] for n in said_no}
    assert set(attempts) == {1}, attempts  # no saver retries: the head, else its reference


# -- a hung endpoint never stalls a runner that has what it needs ------------------------------


def test_a_restore_with_a_valid_local_scope_never_waits_for_a_silent_endpoint_under_the_lock(
    tmp_path: Path, run_fxcache: RunFxcache, seaweed: SeaweedS3, bucket: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """The endpoint accepts connections and never answers. A restore whose local scope is
    valid sends only the last-used marker, holds no lock while it waits for it, and gives
    it up at its small bound (deadline.TOUCH_S), not after 3 attempts of 30 s."""
    from ci_fxcache.store import scopes
    from ci_fxcache.store.layout import Layout

    a = _store(tmp_path, "a", run_fxcache, seaweed, bucket)
    key = _first_job(a)["scope_key"]
    with StallingServer("silent") as server:
        env = {**os.environ, **a.env, "AWS_ENDPOINT_URL_S3": server.endpoint}
        env = {k: v for k, v in env.items() if not k.startswith("GITHUB_")}
        started = time.perf_counter()
        job = subprocess.Popen(
            [sys.executable, "-m", "ci_fxcache", "restore", "--store", "s3", "--json",
             "--python", TORCH_PYTHON, "--root", str(a.root), "--state-file",
             str(tmp_path / "hung.json")],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        while server.requests == 0 and job.poll() is None:
            threading.Event().wait(0.05)
        monkeypatch.setenv("FXCACHE_LOCK_TIMEOUT", "1")
        with scopes.lock(Layout(a.root), key):  # free while the restore waits on the endpoint
            pass
        out, err = job.communicate(timeout=600)
    # README's and docs/store.md's figure (printed, not asserted: no wall-clock limits here)
    print(f"restore with its scope locally, silent endpoint: {time.perf_counter() - started:.2f} s")
    assert job.returncode == 0, err
    state = json.loads(out)
    assert state["hit"] and state["remote"]["local"] and state["remote"]["touched"] is False
    (warning,) = _warnings(err)
    assert "could not mark" in warning and "time bound" in warning, warning
    assert server.requests < 3, server.requests  # no second attempt after the bound


# -- restores that leave the runner as the next job needs it ----------------------------------


def test_a_keyed_job_refetches_the_signed_copy_over_an_unsigned_one_a_keyless_job_fetched(
    tmp_path: Path, run_fxcache: RunFxcache, seaweed: SeaweedS3, bucket: str
) -> None:
    a = _store(tmp_path, "a", run_fxcache, seaweed, bucket, FXCACHE_SIGNING_KEY="k1")
    _first_job(a)
    b = _store(tmp_path, "b", run_fxcache, seaweed, bucket)
    keyless = b.restore("--store", "s3", "--read-only")
    assert keyless["hit"] and keyless["remote"]["fetched"] and not keyless["signed"], keyless
    keyed = b.restore("--store", "s3", state="keyed.json", env={"FXCACHE_SIGNING_KEY": "k1"})
    assert keyed["remote"]["fetched"] and not keyed["remote"]["local"], keyed["remote"]
    assert keyed["hit"] and keyed["signed"] and keyed["files"] == len(SAMPLE), keyed
    assert keyed["quarantined"] == [], keyed["quarantined"]


def test_a_damaged_remote_copy_is_downloaded_once_per_runner_not_by_every_job(
    tmp_path: Path, run_fxcache: RunFxcache, seaweed: SeaweedS3, bucket: str
) -> None:
    a = _store(tmp_path, "a", run_fxcache, seaweed, bucket)
    _first_job(a, {**SAMPLE, "inductor/fxgraph/rn/random": os.urandom(50_000)})
    (pack,) = [k for k in _keys(seaweed, bucket) if "/packs/" in k]
    name, _ = _bucket_name(bucket)
    s3: Any = seaweed.client()
    body = s3.get_object(Bucket=name, Key=pack)["Body"].read()
    s3.put_object(Bucket=name, Key=pack, Body=body[:-1] + bytes([body[-1] ^ 1]))
    b = _store(tmp_path, "b", run_fxcache, seaweed, bucket)
    got = [b.restore("--store", "s3", "--read-only", state=f"s{n}.json") for n in range(3)]
    assert all(not g["hit"] and g["remote"]["error"] for g in got), [g["remote"] for g in got]
    assert len([p for p in (b.root / ".quarantine").iterdir() if p.is_dir()]) == 1
    assert got[0]["remote"]["quarantined"] and got[0]["remote"]["downloaded_bytes"] >= len(body)
    for later in got[1:]:
        remote = later["remote"]
        assert "not downloaded again" in remote["error"], remote
        assert remote["downloaded_bytes"] < len(body) and not remote["quarantined"], remote


def test_a_cancelled_jobs_unsaved_files_do_not_stop_the_next_restore_from_fetching(
    tmp_path: Path, run_fxcache: RunFxcache, seaweed: SeaweedS3, bucket: str
) -> None:
    b = _store(tmp_path, "b", run_fxcache, seaweed, bucket)
    cancelled = b.restore("--store", "s3")
    assert cancelled["remote"]["found"] is False and cancelled["mode"] == "in-place"
    write_files(_compiles_into(cancelled), {"inductor/fxgraph/cc/half-done": b"never saved"})
    end_lease_holders(b.root)  # the job is cancelled: no save, its lease holder gone
    a = _store(tmp_path, "a", run_fxcache, seaweed, bucket)
    _first_job(a)  # meanwhile another runner publishes the scope
    got = b.restore("--store", "s3", state="next.json")
    assert got["remote"]["fetched"] and got["hit"] and got["files"] == len(SAMPLE), got
    assert "inductor/fxgraph/cc/half-done" not in tree_digest(Path(got["scope_dir"]))
    end_lease_holders(b.root)


def test_killed_fetches_of_any_scope_are_removed_and_live_ones_kept(
    tmp_path: Path, run_fxcache: RunFxcache, seaweed: SeaweedS3, bucket: str
) -> None:
    a = _store(tmp_path, "a", run_fxcache, seaweed, bucket)
    _first_job(a)
    b = _store(tmp_path, "b", run_fxcache, seaweed, bucket)
    remote = b.root / ".remote"
    dead = remote / "fetch-fxcache-v1-other-scope.0123456789ab"
    (dead / "inductor").mkdir(parents=True)
    (dead / "inductor" / "half").write_bytes(b"\0" * 1000)
    dead_locked = remote / "fetch-fxcache-v1-third.ba9876543210"
    dead_locked.mkdir()
    dead_locked.with_name(dead_locked.name + ".lock").touch()  # its holder is gone
    early = remote / ".tmp-fetch-fxcache-v1-early.cccccccccccc.lock"  # killed before its fetch
    early.touch()
    live = remote / "fetch-fxcache-v1-live.aaaaaaaaaaaa"
    live.mkdir()
    lock = live.with_name(live.name + ".lock")
    lock.touch()
    with lock.open() as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        got = b.restore("--store", "s3")
        assert got["hit"] and got["remote"]["fetched"], got
        assert not dead.exists() and not dead_locked.exists() and not early.exists()
        assert not dead_locked.with_name(dead_locked.name + ".lock").exists()
        assert live.is_dir() and lock.exists()  # a fetch in progress in another job
    assert sorted(p.name for p in remote.glob("fetch-*")) == [live.name, lock.name]


def test_after_a_killed_first_save_the_next_save_reuses_the_packs_it_uploaded(
    tmp_path: Path, run_fxcache: RunFxcache, seaweed: SeaweedS3, bucket: str
) -> None:
    a = _store(tmp_path, "a", run_fxcache, seaweed, bucket)
    state = a.restore("--store", "s3")
    files = {**SAMPLE, "inductor/fxgraph/bi/big": os.urandom(200_000)}
    write_files(_compiles_into(state), files)
    _kill_save_before_the_head(a)
    packs_before = {k for k in _keys(seaweed, bucket) if "/packs/" in k}
    done = _save_json(a)["remote"]
    assert done["published"] and done["uploaded_bytes"] < 200_000, done
    assert {k for k in _keys(seaweed, bucket) if "/packs/" in k} == packs_before
    assert done["reused_orphans"] == len(packs_before) and done["uploaded_files"] == 0, done
    c = _store(tmp_path, "c", run_fxcache, seaweed, bucket)
    got = c.restore("--store", "s3")
    assert got["hit"] and got["files"] == len(files), got


# -- invalidate --s3: collection, grace, inventory ---------------------------------------------


def _scope_job(store: Any, salt: str, files: dict[str, bytes]) -> str:
    state = store.restore("--store", "s3", "--salt", salt, state=f"{salt}.json")
    write_files(_compiles_into(state), files)
    assert _save_json(store, f"{salt}.json")["remote"]["published"]
    return str(state["scope_key"])


def test_one_unreadable_head_does_not_stop_the_collection_of_the_rest(
    tmp_path: Path, run_fxcache: RunFxcache, seaweed: SeaweedS3, bucket: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    from ci_fxcache.store.policies import Policy
    from ci_fxcache.store.remote.s3 import invalidate as s3_invalidate

    a = _store(tmp_path, "a", run_fxcache, seaweed, bucket)
    gone = _scope_job(a, "gone", {"inductor/fxgraph/go/only-gone": b"g" * 3000})
    gone_objects = {k for k in _keys(seaweed, bucket) if "/packs/" in k or "/segments/" in k}
    broken = _scope_job(a, "broken", SAMPLE)
    broken_objects = {
        k for k in _keys(seaweed, bucket) if "/packs/" in k or "/segments/" in k
    } - gone_objects
    garbage = _scope_job(a, "garbage", {"inductor/fxgraph/gb/only-garbage": b"b" * 3000})
    head = _head(seaweed, bucket, broken)
    head["segments"][0]["files"] = "many"  # readable JSON, names its objects, not a save's
    _put(seaweed, bucket, f"scopes/{broken}/head.json", json.dumps(head).encode())
    _put(seaweed, bucket, f"scopes/{garbage}/head.json", b"\x00not a head")
    huge = _scope_job(a, "huge", {"inductor/fxgraph/hu/only-huge": b"h" * 3000})
    _put(seaweed, bucket, f"scopes/{huge}/head.json", b" " * (16 * 2**20 + 1))  # never read
    name, prefix = _bucket_name(bucket)
    s3: Any = seaweed.client()
    s3.delete_object(Bucket=name, Key=f"{prefix}/scopes/{gone}/head.json")  # removed earlier
    _in_process_env(monkeypatch, seaweed)
    grace = 3 * 3600.0
    later = time.time() + grace + 60  # every object is past the grace
    done = s3_invalidate.run(_tier(bucket), Policy(max_age_s=10 * 86400), dry_run=False,
                             grace_s=grace, now=later)  # fmt: skip
    left = set(_keys(seaweed, bucket))
    assert not gone_objects & left, "the unreferenced objects were not collected"
    assert broken_objects <= left, "objects an unreadable head names were collected"
    gc = done["gc"]
    assert {u["scope"] for u in gc["unreadable"]} == {broken, garbage, huge}, gc
    assert gc["objects_removed"] >= len(gone_objects) + 4, gc  # with the garbage heads'
    for row in done["scopes"]:
        assert (row["problem"] is not None) == (row["scope"] in (broken, garbage, huge)), row


def test_gc_grace_below_the_safe_minimum_is_a_usage_error(
    tmp_path: Path, run_fxcache: RunFxcache, seaweed: SeaweedS3, bucket: str
) -> None:
    env = {**seaweed.env(), "FXCACHE_S3_URL": bucket}
    for grace in ("0s", "30m"):
        proc = run_fxcache("invalidate", "--s3", "--max-age", "14d", "--gc-grace", grace, env=env)
        assert proc.returncode == 2 and "--gc-grace" in proc.stderr, proc.stderr
    ok = run_fxcache("invalidate", "--s3", "--max-age", "14d", "--gc-grace", "3h", env=env)
    assert ok.returncode == 0, ok.stderr


def _invalidate_step(tmp_path: Path, env: dict[str, str], **inputs: str) -> tuple[Any, str]:
    """The invalidate sub-action's step with its own inputs; (the process, the job summary it
    wrote)."""
    from tests.test_invalidate_stores import invalidate_step

    proc = invalidate_step(tmp_path, env, **inputs)
    summary = tmp_path / "summary"
    return proc, summary.read_text() if summary.exists() else ""


def test_the_inventory_lists_every_scope_with_true_sizes_and_frees_only_unshared_bytes(
    tmp_path: Path, run_fxcache: RunFxcache, seaweed: SeaweedS3, bucket: str
) -> None:
    """Two scopes with the same files share their packs (named by content): removing one
    frees nothing while the other keeps them. The inventory (JSON, text, job summary)
    lists both with torch, arch, files, true size, size in the bucket and last use."""
    a = _store(tmp_path, "a", run_fxcache, seaweed, bucket)
    one = _scope_job(a, "one", SAMPLE)
    time.sleep(1.1)  # LastModified has one-second resolution: "two" is the latest
    two = _scope_job(a, "two", SAMPLE)
    stored = sum(i["Size"] for k, i in _keys(seaweed, bucket).items() if "/scopes/" not in k)
    env = {**seaweed.env(), "FXCACHE_S3_URL": bucket}

    dry = run_fxcache("invalidate", "--s3", "--keep-latest", "1", "--dry-run", env=env)
    assert dry.returncode == 0, dry.stderr
    assert "1 cache(s), would free 0 B" in dry.stdout, dry.stdout
    assert one in dry.stdout and two in dry.stdout and "in bucket" in dry.stdout

    listed = run_fxcache("invalidate", "--s3", "--dry-run", "--json", env=env)
    assert listed.returncode == 0, listed.stderr
    inventory = json.loads(listed.stdout)["s3"]
    rows = {r["scope"]: r for r in inventory["scopes"]}
    assert set(rows) == {one, two} and inventory["bucket"]["bytes"] == stored, inventory
    for row in rows.values():
        assert row["action"] == "keep" and row["torch"] == torch_build().version, row
        assert row["files"] == len(SAMPLE) and row["bytes"] == sum(map(len, SAMPLE.values()))
        assert row["stored_bytes"] == stored and row["last_used"] > 0, row

    proc, summary = _invalidate_step(tmp_path, seaweed.env(), target="s3", **{
        "s3-url": bucket, "keep-latest": "1", "dry-run": "true"})  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "### S3" in summary and "| would remove |" in summary and "| keep |" in summary
    assert one in summary.replace("\\", "") and two in summary.replace("\\", "")
    assert "Would free 0 B." in summary, summary


# -- a server that freezes mid-transfer: the operation ends at its bound ------------------------


def _frozen_midway(link: Link, cmd: list[str], env: dict[str, str], after_bytes: int) -> Any:
    """Run `cmd` through `link`, freeze the link once `after_bytes` crossed it; the finished
    process (it must end by itself: 120 s is far below the 600 s read timeouts it has)."""
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)  # fmt: skip
    while link.forwarded_bytes < after_bytes and proc.poll() is None:
        threading.Event().wait(0.01)
    link.freeze()
    try:
        out, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail("the operation still waits on the frozen server")
    return proc.returncode, out, err


@pytest.mark.parametrize("operation", ["restore", "save"])
def test_a_server_frozen_mid_transfer_costs_the_time_bound(
    tmp_path: Path, run_fxcache: RunFxcache, seaweed: SeaweedS3, bucket: str, operation: str
) -> None:
    """SeaweedFS behind a link that stops forwarding in the middle of a 4 MiB pack, every
    connection left open: with per-request timeouts of 600 s (x3 attempts) the restore or
    save ends at FXCACHE_S3_DEADLINE (4 s), warns, and the job goes on (cold, or kept
    locally for the next save)."""
    files = {**SAMPLE, "triton/K5/kernel.cubin": os.urandom(4 * 2**20)}
    host, _, port = seaweed.endpoint.removeprefix("http://").rpartition(":")
    bound = {"FXCACHE_S3_TIMEOUT": "600", "FXCACHE_S3_DEADLINE": "4"}
    with Link((host, int(port)), total_mbit=16) as link:  # 4 MiB take ~2 s
        via = {"AWS_ENDPOINT_URL_S3": link.endpoint, **bound}
        if operation == "restore":
            a = _store(tmp_path, "a", run_fxcache, seaweed, bucket)
            _first_job(a, files)
            b = _store(tmp_path, "b", run_fxcache, seaweed, bucket, **via)
            cmd = [sys.executable, "-m", "ci_fxcache", "restore", "--store", "s3", "--json",
                   "--python", TORCH_PYTHON, "--root", str(b.root), "--state-file",
                   str(tmp_path / "b" / "state.json")]  # fmt: skip
            env = b.env
        else:
            b = _store(tmp_path, "b", run_fxcache, seaweed, bucket, **via)
            state = b.restore("--store", "s3")
            write_files(_compiles_into(state), files)
            cmd = [sys.executable, "-m", "ci_fxcache", "save", "--json", "--state-file",
                   str(tmp_path / "b" / "state.json")]  # fmt: skip
            env = b.env
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("GITHUB_")}, **env}
        start = link.forwarded_bytes
        rc, out, err = _frozen_midway(link, cmd, env, start + 2**20)
    assert rc == 0, err
    result = json.loads(out)
    (warning,) = _warnings(err)
    assert "time bound" in warning, warning
    if operation == "restore":
        assert not result["hit"] and "time bound" in result["remote"]["error"], result
    else:
        assert result["saved"] and not result["remote"]["published"], result
        retried = _save_json(_store(tmp_path, "b", run_fxcache, seaweed, bucket))
        assert retried["remote"]["published"], retried  # the next save publishes it
        c = _store(tmp_path, "c", run_fxcache, seaweed, bucket)
        assert c.restore("--store", "s3")["files"] == len(files)


def test_the_invalidate_summary_renders_every_store_from_the_json() -> None:
    """report/invalidation.markdown over a result of every store (the shapes the commands
    print with --json): cells are escaped, what is freed adds local and GitHub rows and the
    S3 collection, never the S3 rows' sizes."""
    from ci_fxcache.report import invalidation

    row = {"bytes": 2048, "last_used": 1.7e9, "reasons": ["unused for 20.0d > 14.0d"],
           "action": "removed"}  # fmt: skip
    s3_scope = {"scope": "fxcache-v1-x", "torch": "2.13.0", "accel": "cu128", "archs": ["sm90"],
                "pool": "p", "files": 3, "bytes": 999, "stored_bytes": 4096, "last_used": 1.7e9,
                "action": "removed", "reasons": ["r"], "problem": None}  # fmt: skip
    gc = {"objects_removed": 1, "bytes_removed": 1024, "kept_in_grace": 0,
          "unreadable": [{"scope": "y", "problem": "p", "kept_objects": 2}]}  # fmt: skip
    redis = {"url": "redis://h:6379/0", "scanned": 9, "would_remove": 2, "bytes": 10,
             "dry_run": False}  # fmt: skip
    s3 = {"url": "s3://b/p", "dry_run": False, "scopes": [s3_scope], "gc": gc,
          "bucket": {"scopes": 1, "objects": 2, "bytes": 4096}}  # fmt: skip
    rows = [{**row, "store": "local", "scope": "a|b"}, {**row, "store": "github", "scope": "gh"},
            {**row, "store": "s3", "scope": "fxcache-v1-x", "bytes": 4096}]  # fmt: skip
    result = {"dry_run": False, "rows": rows, "redis": redis, "s3": s3}
    text = invalidation.markdown(result)
    assert "a\\|b" in text and "| removed | fxcache-v1-x | 2.13.0 | sm90 | 3 |" in text, text
    assert "1 unreadable head(s)" in text and "Redis" in text
    assert text.rstrip().endswith("Freed 5.0 KiB."), text  # 2 KiB + 2 KiB + 1 KiB
