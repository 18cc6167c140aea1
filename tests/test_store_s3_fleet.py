"""`store: s3` as a fleet uses it (issue 31 points 3-5 and 8, issue 32's S3 signing): one time
bound per operation, many writers, hung endpoints, whatever is in the bucket, inventory.
Against the real SeaweedFS of the session (tests/s3_server.py) and real misbehaving endpoints
(tests/stalling_server.py); scopes are a few small files, no compiles."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from tests.conftest import RunFxcache
from tests.s3_server import SeaweedS3
from tests.stalling_server import StallingServer
from tests.store_helpers import SAMPLE, write_files
from tests.test_store_s3 import _compiles_into, _first_job, _save_json, _store, bucket  # noqa: F401


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
                bucket.get("x/packs/one")
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
    tmp_path: Path, run_fxcache: RunFxcache, seaweed: SeaweedS3, bucket: str, setting: str  # noqa: F811
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
    tmp_path: Path, run_fxcache: RunFxcache, seaweed: SeaweedS3, bucket: str  # noqa: F811
) -> None:
    with StallingServer("silent") as server:
        env = {**seaweed.env(), "FXCACHE_S3_URL": bucket, "AWS_ENDPOINT_URL_S3": server.endpoint,
               "FXCACHE_S3_DEADLINE": "2"}  # fmt: skip
        proc = run_fxcache("invalidate", "--s3", "--max-age", "14d", "--json", env=env)
    assert proc.returncode == 1, (proc.returncode, proc.stderr)
    assert "time bound" in proc.stderr and proc.stdout == "", proc.stderr

