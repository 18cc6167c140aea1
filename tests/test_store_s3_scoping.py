"""Issue 32: runs that must not write the bucket read it only (`fxcache restore
--remote-read-only`, which the action passes to every run its save policy does not publish
from), against a real SeaweedFS (tests/s3_server.py) through the real CLI. What binds a run's
own code is its credentials (docs/security.md); this is fxcache's side of it."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

from tests.conftest import RunFxcache
from tests.s3_server import SeaweedS3
from tests.store_helpers import SAMPLE, Store, write_files


def _objects(seaweed: SeaweedS3, bucket: str) -> dict[str, bytes]:
    s3: Any = seaweed.client()
    contents = s3.list_objects_v2(Bucket=bucket).get("Contents") or []
    return {o["Key"]: s3.get_object(Bucket=bucket, Key=o["Key"])["Body"].read() for o in contents}


def test_a_remote_read_only_run_reads_the_bucket_and_never_writes_it(
    tmp_path: Path, run_fxcache: RunFxcache, seaweed: SeaweedS3
) -> None:
    bucket = f"t-{uuid.uuid4().hex[:16]}"
    seaweed.make_bucket(bucket)
    env = {**seaweed.env(), "FXCACHE_S3_URL": f"s3://{bucket}/ci"}
    writer = Store(tmp_path / "writer" / "root", run_fxcache, env)
    writer.root.parent.mkdir(parents=True)
    state = writer.restore("--store", "s3")
    write_files(Path(state["inductor_dir"]).parent, SAMPLE)
    saved = writer.save()
    assert saved.returncode == 0 and json.loads(saved.stdout)["remote"]["published"]
    before = _objects(seaweed, bucket)

    reader = Store(tmp_path / "reader" / "root", run_fxcache, env)
    reader.root.parent.mkdir(parents=True)
    got = reader.restore("--store", "s3", "--remote-read-only")
    assert got["hit"] and got["remote"]["fetched"] and got["remote"]["read_only"], got
    write_files(Path(got["inductor_dir"]).parent, {"inductor/fxgraph/zz/new/entry": b"new"})
    proc = reader.save()
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["saved"] and result["added"] == 1 and "remote" not in result, result
    assert _objects(seaweed, bucket) == before  # not even the last-used marker


def test_the_action_writes_the_bucket_only_from_the_default_branch(
    tmp_path: Path, seaweed: SeaweedS3
) -> None:
    """A push to main publishes; a same-repository pull request's job then restores from the
    bucket, compiles, and its end-of-job save commits locally without writing the bucket."""
    from tests.test_action_steps import REPO_ID, pull_request_event, run_step

    bucket = f"t-{uuid.uuid4().hex[:16]}"
    seaweed.make_bucket(bucket)
    inputs = {"store": "s3", "s3-url": f"s3://{bucket}/ci"}
    push = {"repository": {"id": REPO_ID, "default_branch": "main"}}
    jobs = {"main": (push, "push", "refs/heads/main"),
            "pr": (pull_request_event(), "pull_request", "refs/pull/7/merge")}  # fmt: skip
    seen = []
    for name, (event, event_name, ref) in jobs.items():
        runner = tmp_path / name
        runner.mkdir()
        common = dict(event=event, event_name=event_name, GITHUB_REF=ref, **seaweed.env())
        setup = run_step(runner, "setup", inputs, **common)
        settings = setup.outputs["settings"]
        restored = run_step(runner, "restore", inputs, FXCACHE_ACTION_SETTINGS=settings,
                            **common)  # fmt: skip
        assert restored.proc.returncode == 0, restored.lines
        state = json.loads((Path(settings).parent / "restore-state.json").read_text())
        write_files(Path(state["inductor_dir"]).parent, {f"inductor/{name}/entry": b"x" * 64})
        post = run_step(runner, "post-save", inputs, **setup.post_env(),
                        **common)  # fmt: skip
        assert post.proc.returncode == 0 and '"saved": true' in post.proc.stdout, post.lines
        seen.append((restored.outputs["cache-hit"], _objects(seaweed, bucket)))
    (main_hit, after_main), (pr_hit, after_pr) = seen
    assert main_hit == "false" and any(k.endswith("head.json") for k in after_main)
    assert pr_hit == "true" and after_pr == after_main
