"""The main job on the local store: restore, verify, save; the next job is hot-only."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from tests.conftest import TORCH_PYTHON, RunFxcache

MATRIX = (
    "--dtypes",
    "float32",
    "--dynamic",
    "false",
    "--mechanisms",
    "fxgraph",
    "--training",
    "false",
    "--workloads",
    "sin_matmul",
    "--device",
    "cpu",
    "--report-id",
    "main-job",
)


def _exports(stdout: str) -> dict[str, str]:
    env = {}
    for line in stdout.splitlines():
        assert line.startswith("export "), line
        name, _, value = line[len("export ") :].partition("=")
        env[name] = shlex.split(value)[0]
    return env


@pytest.mark.slow
def test_restore_verify_save_then_hot_only_from_the_store(
    run_fxcache: RunFxcache, tmp_path: Path
) -> None:
    base = {
        "FXCACHE_ROOT": str(tmp_path / "root"),
        "TMPDIR": str(tmp_path),
        "TORCHINDUCTOR_COMPILE_THREADS": "1",
    }

    def job(n: int) -> tuple[dict[str, str], dict[str, object]]:
        restored = run_fxcache("restore", "--python", TORCH_PYTHON, env=base)
        assert restored.returncode == 0, restored.stderr
        env = _exports(restored.stdout)
        assert {
            "TORCHINDUCTOR_CACHE_DIR",
            "TRITON_CACHE_DIR",
            "FXCACHE_VERIFY_DIR",
            "FXCACHE_STATE_FILE",
        } <= set(env)
        out = tmp_path / f"results-{n}.json"
        verified = run_fxcache(
            "verify",
            "--python",
            TORCH_PYTHON,
            *MATRIX,
            "--json",
            str(out),
            env={**base, **env},
            timeout=900,
        )
        assert verified.returncode == 0, verified.stdout + verified.stderr
        saved = run_fxcache("save", env={**base, **env})
        assert saved.returncode == 0, saved.stderr
        return env, json.loads(out.read_text())

    env1, first = job(1)
    assert Path(env1["FXCACHE_VERIFY_DIR"]).is_relative_to(tmp_path / "root")
    assert first["settings"]["phase"] == "both"
    assert first["report_id"] == "main-job"
    assert first["cache"]["hit"] is False
    (combo1,) = first["combos"]
    assert combo1["verdict"] == "safe", combo1["reason"]

    env2, second = job(2)
    assert env2["FXCACHE_VERIFY_DIR"] == env1["FXCACHE_VERIFY_DIR"]  # same scope, in place
    assert second["cache"]["hit"] is True  # embedded from restore's state file
    assert second["settings"]["phase"] == "hot"  # references travelled with the scope
    (combo2,) = second["combos"]
    assert combo2["verdict"] == "safe", combo2["reason"]
    assert combo2["hot"]["counters"].get("fxgraph_cache_hit", 0) >= 1
    assert combo2["max_abs_err"]["hot_vs_cold"] == 0.0
