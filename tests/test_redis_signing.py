"""Issue 26 §2: Redis entries are code (torch's remote FX-graph cache unpickles them) and the
signature does not cover them: a restore with a signing key refuses `store redis` unless the
user opts in with `--redis-writers-run-code` (action input `redis-writers-run-code`)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import TORCH_PYTHON, RunFxcache
from tests.test_action_steps import run_step

KEY = {"FXCACHE_SIGNING_KEY": "team-secret"}


def _restore(run: RunFxcache, tmp_path: Path, url: str, *extra: str, env: dict | None = None):
    return run(
        "restore", "--root", str(tmp_path / "root"), "--python", TORCH_PYTHON, "--json",
        "--store", "redis", "--redis-url", url, "--state-file", str(tmp_path / "s.json"),
        *extra, env=env,
    )  # fmt: skip


def test_a_keyed_restore_refuses_redis_without_the_opt_in(
    run_fxcache: RunFxcache, tmp_path: Path, redis_url: str
) -> None:
    proc = _restore(run_fxcache, tmp_path, redis_url, env=KEY)
    assert proc.returncode == 2, proc.stdout
    (line,) = proc.stderr.strip().splitlines()
    assert "pickle" in line and "runs code" in line and "--redis-writers-run-code" in line
    assert proc.stdout == "" and not (tmp_path / "s.json").exists()


def test_the_opt_in_turns_the_remote_cache_on(
    run_fxcache: RunFxcache, tmp_path: Path, redis_url: str
) -> None:
    proc = _restore(run_fxcache, tmp_path, redis_url, "--redis-writers-run-code", env=KEY)
    assert proc.returncode == 0, proc.stderr
    state = json.loads(proc.stdout)
    assert state["store"] == "redis" and state["redis"]["reachable"] is True
    assert state["signature_checked"] is True


def test_without_a_key_redis_needs_no_opt_in(
    run_fxcache: RunFxcache, tmp_path: Path, redis_url: str
) -> None:
    proc = _restore(run_fxcache, tmp_path, redis_url)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["redis"]["reachable"] is True


def test_the_action_input_reaches_restore(tmp_path: Path, redis_url: str) -> None:
    inputs = {"store": "redis", "redis-url": redis_url, "signing-key": "team-secret"}
    push = {"ref": "refs/heads/main", "repository": {"default_branch": "main"}}
    setup = run_step(tmp_path, "setup", inputs, event=push, event_name="push")
    assert setup.proc.returncode == 0, setup.lines
    assert setup.settings()["remote"] is True
    settings = {"FXCACHE_ACTION_SETTINGS": setup.outputs["settings"]}
    refused = run_step(tmp_path, "restore", inputs, event=push, event_name="push", **settings)
    assert refused.proc.returncode == 2
    assert any(line.startswith("::error::") and "redis-writers-run-code" in line
               for line in refused.lines), refused.lines  # fmt: skip
    allowed = run_step(
        tmp_path, "restore", {**inputs, "redis-writers-run-code": "true"}, event=push,
        event_name="push", **settings,
    )  # fmt: skip
    assert allowed.proc.returncode == 0, allowed.lines
    assert "TORCHINDUCTOR_REDIS_URL" in (tmp_path / "github-env").read_text()
