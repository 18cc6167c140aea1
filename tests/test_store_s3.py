"""`store: s3`: the remote tier in a real SeaweedFS (tests/s3_server.py), driven through the
real CLI. Two runners are two store roots on this machine; faults are injected into the real
bucket (objects deleted or overwritten) or by real servers that misbehave (503, hang)."""

from __future__ import annotations

import http.server
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, TORCH_PYTHON, RunFxcache
from tests.s3_server import SECRET_KEY, SeaweedS3
from tests.store_helpers import SAMPLE, Store, tree_digest, write_files

JOB = str(ROOT / "tests" / "store_job.py")


@pytest.fixture
def bucket(seaweed: SeaweedS3) -> str:
    """A fresh bucket per test; its s3:// URL with a prefix."""
    name = f"t-{uuid.uuid4().hex[:16]}"
    seaweed.make_bucket(name)
    return f"s3://{name}/fleet/ci"


def _store(tmp_path: Path, name: str, run: RunFxcache, seaweed: SeaweedS3, url: str,
           **env: str) -> Store:  # fmt: skip
    root = tmp_path / name / "root"
    root.parent.mkdir(parents=True, exist_ok=True)
    return Store(root, run, {**seaweed.env(), "FXCACHE_S3_URL": url, **env})


def _objects(seaweed: SeaweedS3, url: str) -> dict[str, bytes]:
    """Every object under the URL's bucket: key -> body."""
    s3: Any = seaweed.client()
    bucket = url.removeprefix("s3://").split("/")[0]
    found = {}
    for item in s3.list_objects_v2(Bucket=bucket).get("Contents") or []:
        found[item["Key"]] = s3.get_object(Bucket=bucket, Key=item["Key"])["Body"].read()
    return found


def _save_json(store: Store, state: str = "state.json", **env: str) -> dict[str, Any]:
    proc = store.save(state, env=env or None)
    assert proc.returncode == 0, proc.stderr
    data: dict[str, Any] = json.loads(proc.stdout)
    data["_stderr"] = proc.stderr
    return data


def _warnings(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "warning" in line]


def _compiles_into(state: dict[str, Any]) -> Path:
    """Where the job's compiles write: the scope in place, or (a signing key's private
    writes, issue 26) its overlay."""
    return Path(state["inductor_dir"]).parent


def _kill_save_before_the_head(store: Store) -> None:
    """`fxcache save` of `store`, killed once its packs and segment are uploaded and before it
    writes the head (the `s3-pause` test fault): a save killed half-way."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "ci_fxcache", "save", "--state-file",
         str(store.root.parent / "state.json")],
        env={**os.environ, **store.env, "FXCACHE_TEST_FAULT": "s3-pause:60"},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    assert "pausing before the head" in proc.stdout.readline()
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()


def _first_job(store: Store, files: dict[str, bytes] = SAMPLE) -> dict[str, Any]:
    state = store.restore("--store", "s3")
    assert state["remote"]["found"] is False, state
    write_files(_compiles_into(state), files)
    saved = _save_json(store)
    assert saved["saved"] and saved["remote"]["published"], saved
    return state


def test_an_empty_runner_restores_what_another_saved_and_a_valid_local_tier_downloads_nothing(
    tmp_path: Path, run_fxcache: RunFxcache, seaweed: SeaweedS3, bucket: str
) -> None:
    a = _store(tmp_path, "a", run_fxcache, seaweed, bucket)
    first = _first_job(a)
    b = _store(tmp_path, "b", run_fxcache, seaweed, bucket)
    got = b.restore("--store", "s3")
    assert got["hit"] and got["remote"]["fetched"] and got["files"] == len(SAMPLE), got
    assert got["mode"] == "in-place" and got["scope_key"] == first["scope_key"]
    assert tree_digest(Path(got["scope_dir"]) / "inductor") == tree_digest(
        Path(first["scope_dir"]) / "inductor"
    )
    for rel in SAMPLE:  # committed files, as a local save leaves them
        assert (Path(got["scope_dir"]) / rel).stat().st_mode & 0o222 == 0
    assert _warnings(got["_stderr"]) == [], got["_stderr"]
    assert b.save().returncode == 0
    again = b.restore("--store", "s3", state="again.json")
    remote = again["remote"]
    assert again["hit"] and not remote["fetched"] and remote["local"], remote
    # The last-used marker is the only request: nothing of the scope is downloaded.
    assert remote["requests"] == {"put_object": 1} and remote["downloaded_bytes"] == 0, remote
    state_text = (b.root.parent / "state.json").read_text()
    assert SECRET_KEY not in state_text and SECRET_KEY not in got["_stderr"]


@pytest.mark.slow
def test_a_fresh_process_on_the_second_runner_hits_the_fx_graph_cache(
    tmp_path: Path, seaweed: SeaweedS3, bucket: str
) -> None:
    """The issue's "done when": A compiles (real torch) and saves to S3; B starts empty,
    restores from S3, and a fresh process's compile of the same function is an FX graph hit."""
    env = {**os.environ, **seaweed.env(), "FXCACHE_S3_URL": bucket}
    env = {k: v for k, v in env.items() if not k.startswith(("GITHUB_", "FXCACHE_ROOT"))}

    def job(root: Path) -> dict[str, Any]:
        proc = subprocess.run(
            [TORCH_PYTHON, JOB, "--root", str(root), "--fns", "f0", "--store", "s3"],
            capture_output=True, text=True, env=env, timeout=900, check=False,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-3000:]
        report: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
        return report

    a = job(tmp_path / "a")
    assert a["functions"]["f0"]["miss"] >= 1 and a["functions"]["f0"]["hit"] == 0, a
    assert a["save"]["remote"]["published"], a["save"]
    b = job(tmp_path / "b")
    assert b["state"]["remote"]["fetched"] and b["state"]["hit"], b["state"]
    assert b["functions"]["f0"]["hit"] >= 1 and b["functions"]["f0"]["miss"] == 0, b
    assert b["functions"]["f0"]["close"]


def test_read_only_runs_read_the_bucket_and_never_write_it(
    tmp_path: Path, run_fxcache: RunFxcache, seaweed: SeaweedS3, bucket: str
) -> None:
    a = _store(tmp_path, "a", run_fxcache, seaweed, bucket)
    _first_job(a)
    before = _objects(seaweed, bucket)
    b = _store(tmp_path, "b", run_fxcache, seaweed, bucket)
    got = b.restore("--store", "s3", "--read-only")
    assert got["hit"] and got["read_only"] and got["remote"]["fetched"], got
    write_files(Path(got["inductor_dir"]), {"fxgraph/zz/new": b"from an untrusted job"})
    saved = _save_json(b)
    assert not saved["saved"] and "remote" not in saved
    time.sleep(1.1)  # a marker PUT would show as a newer LastModified too
    assert _objects(seaweed, bucket) == before


def test_a_save_uploads_only_what_the_bucket_lacks(
    tmp_path: Path, run_fxcache: RunFxcache, seaweed: SeaweedS3, bucket: str
) -> None:
    a = _store(tmp_path, "a", run_fxcache, seaweed, bucket)
    state = _first_job(a)
    new = {"inductor/fxgraph/ef/new-entry": os.urandom(20000)}
    again = a.restore("--store", "s3", state="s2.json")
    write_files(_compiles_into(again), new)
    saved = _save_json(a, "s2.json")["remote"]
    assert saved["published"] and saved["uploaded_files"] == 1 and saved["files"] == 1, saved
    assert saved["uploaded_bytes"] <= 2 * 20000 + 4096, saved  # the pack, a segment, the head
    nothing = _save_json(a, "s2.json")["remote"]
    assert not nothing["published"] and nothing["uploaded_bytes"] == 0, nothing
    c = _store(tmp_path, "c", run_fxcache, seaweed, bucket)
    got = c.restore("--store", "s3")
    assert got["files"] == len(SAMPLE) + 1, got
    assert tree_digest(Path(got["scope_dir"])).keys() >= {*SAMPLE, *new}
    assert state["scope_key"] == got["scope_key"]


def test_two_runners_saving_the_same_scope_at_once_lose_nobodys_files(
    tmp_path: Path, run_fxcache: RunFxcache, seaweed: SeaweedS3, bucket: str
) -> None:
    """A's publish is held after its packs (the head it read is then stale) while B publishes;
    A's conditional PUT fails, it re-reads the head and merges: both files are in the bucket."""
    a = _store(tmp_path, "a", run_fxcache, seaweed, bucket)
    b = _store(tmp_path, "b", run_fxcache, seaweed, bucket)
    sa, sb = a.restore("--store", "s3"), b.restore("--store", "s3")
    write_files(_compiles_into(sa), {"inductor/fxgraph/aa/from-a": b"A" * 5000})
    write_files(_compiles_into(sb), {"inductor/fxgraph/bb/from-b": b"B" * 5000})
    held = subprocess.Popen(
        [sys.executable, "-m", "ci_fxcache", "save", "--json", "--state-file",
         str(a.root.parent / "state.json")],
        env={**os.environ, **a.env, "FXCACHE_TEST_FAULT": "s3-pause:4"},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert held.stdout is not None
    assert "pausing before the head" in held.stdout.readline()
    assert _save_json(b)["remote"]["published"]
    out, err = held.communicate(timeout=120)
    assert held.returncode == 0 and json.loads(out)["remote"]["published"], err
    c = _store(tmp_path, "c", run_fxcache, seaweed, bucket)
    got = c.restore("--store", "s3")
    names = set(tree_digest(Path(got["scope_dir"]) / "inductor"))
    assert {"fxgraph/aa/from-a", "fxgraph/bb/from-b"} <= names, names


def test_a_save_killed_during_its_upload_is_completed_by_the_next_save(
    tmp_path: Path, run_fxcache: RunFxcache, seaweed: SeaweedS3, bucket: str
) -> None:
    a = _store(tmp_path, "a", run_fxcache, seaweed, bucket)
    state = a.restore("--store", "s3")
    write_files(_compiles_into(state), SAMPLE)
    _kill_save_before_the_head(a)
    c = _store(tmp_path, "c", run_fxcache, seaweed, bucket)
    assert c.restore("--store", "s3")["remote"]["found"] is False  # no head yet
    done = _save_json(a)
    assert done["saved"] and done["added"] == 0 and done["remote"]["published"], done
    d = _store(tmp_path, "d", run_fxcache, seaweed, bucket)
    got = d.restore("--store", "s3")
    assert got["hit"] and got["files"] == len(SAMPLE), got


@pytest.mark.parametrize("damage", ["delete", "overwrite"])
def test_a_damaged_pack_is_quarantined_locally_and_the_next_save_repairs_the_bucket(
    tmp_path: Path, run_fxcache: RunFxcache, seaweed: SeaweedS3, bucket: str, damage: str
) -> None:
    a = _store(tmp_path, "a", run_fxcache, seaweed, bucket)
    _first_job(a)
    (pack,) = [k for k in _objects(seaweed, bucket) if "/packs/" in k]
    seaweed.damage(bucket, pack, damage)
    b = _store(tmp_path, "b", run_fxcache, seaweed, bucket)
    got = b.restore("--store", "s3")
    assert not got["hit"] and got["files"] == 0 and got["mode"] == "in-place", got
    assert got["remote"]["quarantined"], got["remote"]
    (warning,) = _warnings(got["_stderr"])
    assert "refused" in warning and "continuing cold" in warning
    assert list((b.root / ".quarantine").glob("*.json"))
    assert not any(Path(got["inductor_dir"]).rglob("*")) or not any(
        p.is_file() for p in Path(got["inductor_dir"]).rglob("*")
    )
    write_files(_compiles_into(got), SAMPLE)  # the cold job compiles the same entries
    repaired = _save_json(b)["remote"]
    assert repaired["published"] and repaired["uploaded_files"] == len(SAMPLE), repaired
    c = _store(tmp_path, "c", run_fxcache, seaweed, bucket)
    healed = c.restore("--store", "s3")
    assert healed["hit"] and healed["files"] == len(SAMPLE), healed


def test_signing_covers_the_remote_head(
    tmp_path: Path, run_fxcache: RunFxcache, seaweed: SeaweedS3, bucket: str
) -> None:
    a = _store(tmp_path, "a", run_fxcache, seaweed, bucket, FXCACHE_SIGNING_KEY="k1")
    _first_job(a)
    good = _store(tmp_path, "b", run_fxcache, seaweed, bucket, FXCACHE_SIGNING_KEY="k1")
    got = good.restore("--store", "s3")
    assert got["hit"] and got["signed"] and got["signature_checked"], got
    other = _store(tmp_path, "c", run_fxcache, seaweed, bucket, FXCACHE_SIGNING_KEY="k2")
    refused = other.restore("--store", "s3")
    assert not refused["hit"] and "signature" in refused["remote"]["error"], refused
    # A head rewritten without its signature (someone with bucket access) is refused too.
    s3: Any = seaweed.client()
    name = bucket.removeprefix("s3://").split("/")[0]
    (head_key,) = [k for k in _objects(seaweed, bucket) if k.endswith("/head.json")]
    head = json.loads(s3.get_object(Bucket=name, Key=head_key)["Body"].read())
    del head["signature"]
    s3.put_object(Bucket=name, Key=head_key, Body=json.dumps(head).encode())
    d = _store(tmp_path, "d", run_fxcache, seaweed, bucket, FXCACHE_SIGNING_KEY="k1")
    unsigned = d.restore("--store", "s3")
    assert not unsigned["hit"] and "not signed" in unsigned["remote"]["error"], unsigned


# -- an unusable bucket: one warning, local-only, never a failed or hung job -----------------


def _local_only(store: Store, expect: str) -> None:
    got = store.restore("--store", "s3")
    assert got["remote"]["error"] and not got["remote"]["fetched"], got
    (warning,) = _warnings(got["_stderr"])
    assert expect in warning and "local store only" in warning, warning
    assert got["mode"] == "in-place"
    write_files(_compiles_into(got), SAMPLE)
    saved = _save_json(store)
    assert saved["saved"] and saved["files"] == len(SAMPLE), saved  # the local tier still works
    assert saved["remote"]["published"] is False and saved["remote"]["error"], saved
    (warning,) = _warnings(saved["_stderr"])
    assert "kept locally" in warning
    for text in (got["_stderr"], saved["_stderr"], json.dumps(got), json.dumps(saved)):
        assert SECRET_KEY not in text and "wrong-secret" not in text


def test_a_wrong_secret_is_one_warning_and_local_only(
    tmp_path: Path, run_fxcache: RunFxcache, seaweed: SeaweedS3, bucket: str
) -> None:
    store = _store(tmp_path, "a", run_fxcache, seaweed, bucket,
                   AWS_SECRET_ACCESS_KEY="wrong-secret")  # fmt: skip
    _local_only(store, "credentials refused")


def test_a_missing_bucket_is_one_warning_and_local_only(
    tmp_path: Path, run_fxcache: RunFxcache, seaweed: SeaweedS3
) -> None:
    store = _store(tmp_path, "a", run_fxcache, seaweed, "s3://no-such-bucket-here/x")
    _local_only(store, "does not exist")


def test_an_unreachable_endpoint_is_one_warning_and_local_only(
    tmp_path: Path, run_fxcache: RunFxcache, seaweed: SeaweedS3, bucket: str
) -> None:
    with socket.socket() as sock:  # bound, never listening: connections are refused
        sock.bind(("127.0.0.1", 0))
        endpoint = f"http://127.0.0.1:{sock.getsockname()[1]}"
        store = _store(tmp_path, "a", run_fxcache, seaweed, bucket, AWS_ENDPOINT_URL_S3=endpoint)
        _local_only(store, "failed")


class _Misbehaving(http.server.BaseHTTPRequestHandler):
    """503 SlowDown for every request (mode "slowdown"), or no answer at all ("hang")."""

    mode = "slowdown"
    seen: list[str]

    def _answer(self) -> None:
        self.seen.append(f"{self.command} {self.path}")
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        if self.mode == "hang":
            time.sleep(30)
            return
        body = (
            b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code>'
            b"<Message>Please reduce your request rate.</Message></Error>"
        )
        self.send_response(503)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_PUT = do_HEAD = do_POST = do_DELETE = _answer

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def misbehaving() -> Iterator[type[_Misbehaving]]:
    handler = type("Handler", (_Misbehaving,), {"seen": []})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    handler.endpoint = f"http://127.0.0.1:{server.server_address[1]}"  # type: ignore[attr-defined]
    yield handler
    server.shutdown()


def test_throttling_is_retried_a_bounded_number_of_times_then_local_only(
    tmp_path: Path, run_fxcache: RunFxcache, seaweed: SeaweedS3, bucket: str,
    misbehaving: type[_Misbehaving],
) -> None:  # fmt: skip
    endpoint = misbehaving.endpoint  # type: ignore[attr-defined]
    store = _store(tmp_path, "a", run_fxcache, seaweed, bucket, AWS_ENDPOINT_URL_S3=endpoint)
    _local_only(store, "throttled")
    from ci_fxcache.store.remote.s3.client import MAX_ATTEMPTS

    # restore: the head and the listing of its references at once (attempts each); save: the
    # head (attempts); nothing after the first refusal
    assert len(misbehaving.seen) == 3 * MAX_ATTEMPTS, misbehaving.seen
    assert sum("list-type=2" in r for r in misbehaving.seen) == MAX_ATTEMPTS, misbehaving.seen


def test_a_hung_server_costs_bounded_timeouts_then_local_only(
    tmp_path: Path, run_fxcache: RunFxcache, seaweed: SeaweedS3, bucket: str,
    misbehaving: type[_Misbehaving],
) -> None:  # fmt: skip
    misbehaving.mode = "hang"
    endpoint = misbehaving.endpoint  # type: ignore[attr-defined]
    store = _store(tmp_path, "a", run_fxcache, seaweed, bucket, AWS_ENDPOINT_URL_S3=endpoint,
                   FXCACHE_S3_TIMEOUT="1")  # fmt: skip
    _local_only(store, "failed")


# -- invalidate --s3 -------------------------------------------------------------------------


def _invalidate(run: RunFxcache, store: Store, *args: str) -> dict[str, Any]:
    proc = run("invalidate", "--s3", "--json", *args, env=store.env)
    assert proc.returncode == 0, proc.stderr
    data: dict[str, Any] = json.loads(proc.stdout)
    return data


def test_invalidate_s3_applies_the_policies_then_collects_unreferenced_objects(
    tmp_path: Path, run_fxcache: RunFxcache, seaweed: SeaweedS3, bucket: str
) -> None:
    a = _store(tmp_path, "a", run_fxcache, seaweed, bucket)
    old = _first_job(a)
    newer = a.restore("--store", "s3", "--salt", "second", state="s2.json")
    write_files(_compiles_into(newer), {"inductor/fxgraph/zz/other": b"other" * 999})
    assert _save_json(a, "s2.json")["remote"]["published"]
    time.sleep(1.1)  # LastModified has one-second resolution
    b = _store(tmp_path, "b", run_fxcache, seaweed, bucket)
    b.restore("--store", "s3", "--salt", "second")  # a trusted restore refreshes the marker
    before = _objects(seaweed, bucket)
    assert any(k.endswith(f"{newer['scope_key']}/last-used") for k in before)

    dry = _invalidate(run_fxcache, a, "--keep-latest", "1", "--dry-run")
    assert [(r["scope"], r["action"]) for r in dry["rows"]] == [(old["scope_key"], "would remove")]
    assert dry["s3"]["gc"]["objects_removed"] == 0  # everything is still referenced
    assert _objects(seaweed, bucket) == before

    done = _invalidate(run_fxcache, a, "--keep-latest", "1")
    assert [(r["scope"], r["action"]) for r in done["rows"]] == [(old["scope_key"], "removed")]
    gc = done["s3"]["gc"]
    assert gc["objects_removed"] == 0 and gc["kept_in_grace"] == 2, gc  # its pack and segment
    from ci_fxcache.store.policies import Policy
    from ci_fxcache.store.remote.s3 import client as s3_client
    from ci_fxcache.store.remote.s3 import invalidate as s3_invalidate
    from ci_fxcache.store.remote.s3 import tier as s3_tier

    os.environ.update(a.env)
    try:  # a day later, past the grace period (its minimum refuses 0s: issue 31)
        tier = s3_tier.S3Tier(s3_client.parse_url(bucket))
        swept = s3_invalidate.run(tier, Policy(keep_latest=1), dry_run=False,
                                  now=time.time() + s3_invalidate.DEFAULT_GRACE_S + 60)  # fmt: skip
    finally:
        for name in a.env:
            os.environ.pop(name, None)
    assert swept["rows"] == [] and swept["gc"]["objects_removed"] == 2, swept
    left = _objects(seaweed, bucket)
    assert not any(old["scope_key"] in k for k in left)
    c = _store(tmp_path, "c", run_fxcache, seaweed, bucket)
    assert c.restore("--store", "s3", "--salt", "second")["hit"]  # the kept scope is whole
    assert not c.restore("--store", "s3", state="s3.json")["remote"]["found"]


def test_invalidate_s3_max_age_follows_the_last_used_marker(
    tmp_path: Path, run_fxcache: RunFxcache, seaweed: SeaweedS3, bucket: str
) -> None:
    from ci_fxcache.store.policies import Policy
    from ci_fxcache.store.remote.s3 import client as s3_client
    from ci_fxcache.store.remote.s3 import invalidate as s3_invalidate
    from ci_fxcache.store.remote.s3 import tier as s3_tier

    a = _store(tmp_path, "a", run_fxcache, seaweed, bucket)
    state = _first_job(a)
    os.environ.update(seaweed.env())
    try:
        tier = s3_tier.S3Tier(s3_client.parse_url(bucket))
        policy = Policy(max_age_s=3600)
        fresh = s3_invalidate.run(tier, policy, dry_run=True)
        later = s3_invalidate.run(tier, policy, dry_run=True, now=time.time() + 7200)
    finally:
        for name in seaweed.env():
            os.environ.pop(name, None)
    assert fresh["rows"] == []
    assert [r["scope"] for r in later["rows"]] == [state["scope_key"]]
    assert "unused for" in later["rows"][0]["reasons"][0]


# -- the action's inputs: store s3 + s3-url ---------------------------------------------------


def test_the_action_with_store_s3_publishes_and_a_forks_run_reads_without_writing(
    tmp_path: Path, seaweed: SeaweedS3, bucket: str
) -> None:
    from tests.test_action_steps import REPO_ID, pull_request_event, run_step

    # save: always, as this job is a pull request's (save: auto writes the bucket from the
    # default branch's push and schedule runs only: tests/test_store_s3_scoping.py)
    inputs = {"store": "s3", "s3-url": bucket, "save": "always"}
    aws = seaweed.env()
    runner = tmp_path / "a"
    runner.mkdir()
    setup = run_step(runner, "setup", inputs)
    settings = setup.outputs["settings"]
    assert json.loads(Path(settings).read_text())["remote"] is True
    restored = run_step(runner, "restore", inputs, FXCACHE_ACTION_SETTINGS=settings, **aws)
    assert restored.proc.returncode == 0 and restored.outputs["cache-hit"] == "false"
    state = json.loads(Path(restored.outputs["state-file"]).read_text())
    assert state["remote"]["url"] == bucket
    write_files(_compiles_into(state), SAMPLE)
    post = run_step(runner, "post-save", inputs, FXCACHE_ACTION_SETTINGS=settings, **aws,
                    **setup.post_env())  # fmt: skip
    assert post.proc.returncode == 0, post.lines
    assert any('"published": true' in line for line in post.lines), post.lines
    before = _objects(seaweed, bucket)

    fork = pull_request_event(head_name="someone/demo", head_id=REPO_ID + 1)
    runner_b = tmp_path / "b"
    runner_b.mkdir()
    settings_b = run_step(runner_b, "setup", inputs, event=fork).outputs["settings"]
    got = run_step(runner_b, "restore", inputs, event=fork, FXCACHE_ACTION_SETTINGS=settings_b,
                   **aws)  # fmt: skip
    assert got.proc.returncode == 0 and got.outputs["cache-hit"] == "true", got.lines
    state_b = json.loads(Path(got.outputs["state-file"]).read_text())
    assert state_b["read_only"] and state_b["remote"]["fetched"]
    write_files(Path(state_b["inductor_dir"]), {"fxgraph/zz/planted": b"from a fork"})
    run_step(runner_b, "post-save", inputs, event=fork, FXCACHE_ACTION_SETTINGS=settings_b, **aws)
    time.sleep(1.1)
    assert _objects(seaweed, bucket) == before
    for step in (restored, post, got):
        assert all(SECRET_KEY not in line for line in step.lines)


def test_action_inputs_refuse_an_s3_url_with_credentials(tmp_path: Path) -> None:
    from tests.test_action_steps import run_step

    bad = run_step(tmp_path, "setup", {"store": "s3", "s3-url": "s3://AKIA:secret@bucket/x"})
    assert bad.proc.returncode == 2, bad.lines
    (error,) = bad.errors
    assert "no credentials" in error and "secret" not in error.replace("no credentials", "")


def test_a_fetch_killed_half_way_is_never_served_and_is_cleared_by_the_next(
    tmp_path: Path, run_fxcache: RunFxcache, seaweed: SeaweedS3, bucket: str
) -> None:
    a = _store(tmp_path, "a", run_fxcache, seaweed, bucket)
    key = _first_job(a)["scope_key"]
    b = _store(tmp_path, "b", run_fxcache, seaweed, bucket)
    partial = b.root / ".remote" / f"fetch-{key}.0123456789ab" / "inductor" / "fxgraph"
    partial.mkdir(parents=True)
    (partial / "half-written").write_bytes(b"\0" * 100)
    got = b.restore("--store", "s3")
    assert got["hit"] and got["files"] == len(SAMPLE) and got["remote"]["fetched"], got
    assert not (b.root / ".remote" / f"fetch-{key}.0123456789ab").exists()
    assert "half-written" not in tree_digest(Path(got["scope_dir"]))


def test_a_forged_index_that_leaves_the_scope_is_refused_and_writes_nothing_outside(
    tmp_path: Path, run_fxcache: RunFxcache, seaweed: SeaweedS3, bucket: str
) -> None:
    """Someone with write access to the bucket (no signing key in use) forges a head whose
    segment places a file outside the cache dirs: the fetch refuses it, nothing is written."""
    import gzip
    import hashlib

    a = _store(tmp_path, "a", run_fxcache, seaweed, bucket)
    key = _first_job(a)["scope_key"]
    s3: Any = seaweed.client()
    name, _, prefix = bucket.removeprefix("s3://").partition("/")
    payload = b"planted"
    pack = hashlib.sha256(payload).hexdigest()
    s3.put_object(Bucket=name, Key=f"{prefix}/packs/{pack}", Body=payload)
    for rel in ("inductor/../../../escaped", "/tmp/escaped", "manifest.json"):
        entry = {"sha256": pack, "size": len(payload), "offset": 0, "pack": pack}
        segment = {"schema": "fxcache-s3-segment/1", "files": {rel: entry}}
        raw = gzip.compress(json.dumps(segment).encode())
        digest = hashlib.sha256(raw).hexdigest()
        s3.put_object(Bucket=name, Key=f"{prefix}/segments/{digest}", Body=raw)
        head = {"schema": "fxcache-s3-head/1", "scope_key": key, "fingerprint": {},
                "torch_paths": [], "created_at": "", "updated_at": "",
                "verification": {"references": []}, "files": 1, "total_bytes": len(payload),
                "segments": [{"sha256": digest, "files": 1, "packs": [pack]}]}  # fmt: skip
        s3.put_object(Bucket=name, Key=f"{prefix}/scopes/{key}/head.json",
                      Body=json.dumps(head).encode())  # fmt: skip
        b = _store(tmp_path, f"b{len(rel)}", run_fxcache, seaweed, bucket)
        got = b.restore("--store", "s3")
        assert not got["hit"] and "malformed" in got["remote"]["error"], got["remote"]
        assert not any(p.name == "escaped" for p in tmp_path.rglob("*"))


def test_fetched_files_are_created_read_only_with_the_stat_the_manifest_records(
    tmp_path: Path, run_fxcache: RunFxcache, seaweed: SeaweedS3, bucket: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """The fetch creates each file read-only (0444, as a local save leaves it, also under a
    umask that takes the group's and others' bits) in directories it made up front at any
    depth, and records the stat of the open file: the manifest's sizes and mtimes are the
    files' own, so the local restore's fast check passes without hashing anything again."""
    from ci_fxcache.store.layout import Layout
    from ci_fxcache.store.remote.s3 import client as s3_client
    from ci_fxcache.store.remote.s3 import tier as s3_tier

    files = {**SAMPLE, "inductor/fxgraph/ab/cd/ef/deep": b"deep" * 999, "triton/a/b/c/k": b"k"}
    a = _store(tmp_path, "a", run_fxcache, seaweed, bucket)
    key = _first_job(a, files)["scope_key"]
    for name, value in seaweed.env().items():
        monkeypatch.setenv(name, value)
    layout = Layout(tmp_path / "b")
    (layout.root / ".remote").mkdir(parents=True)
    target = layout.root / ".remote" / "fetch-test"
    tier = s3_tier.S3Tier(s3_client.parse_url(bucket))
    old = os.umask(0o077)
    try:
        got = tier.fetch(layout, key, target, None)
    finally:
        os.umask(old)
    assert got is not None and got.files == len(files), got
    manifest = json.loads((target / "manifest.json").read_text())
    assert sorted(manifest["files"]) == sorted(files)
    for rel, body in files.items():
        st = os.lstat(target / rel)
        assert st.st_mode & 0o777 == 0o444, (rel, oct(st.st_mode))
        assert (target / rel).read_bytes() == body
        meta = manifest["files"][rel]
        assert (meta["size"], meta["mtime_ns"]) == (st.st_size, st.st_mtime_ns), rel
    from ci_fxcache.store import manifest as mf

    assert mf.inspect(target, manifest, full=False).problems == []
