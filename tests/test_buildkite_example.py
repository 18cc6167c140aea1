"""The Buildkite pipeline example (ci/buildkite/pipeline.yml): its step's command run in bash
as the agent runs it after upload (`$$` becomes `$`), with the pipeline's env, and a stand-in
`buildkite-agent` on PATH that records the annotation: the report is annotated with context
fxcache and a success style, the store is saved, the job's own step sees the restored cache.
No Buildkite agent can be installed from the registries here, hence the stand-in."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT, TORCH_PYTHON

PIPELINE = ROOT / "ci/buildkite/pipeline.yml"
AGENT = """#!/bin/sh
# buildkite-agent stand-in: records `annotate` arguments and the body read from stdin.
[ "$1" = annotate ] || exit 2
printf '%s\\n' "$@" >"$ANNOTATE_OUT.args"
cat >"$ANNOTATE_OUT.body"
"""


def _step() -> dict[str, object]:
    doc = yaml.safe_load(PIPELINE.read_text())
    (step,) = doc["steps"]
    assert isinstance(step, dict)
    return step


def test_the_step_annotates_with_its_own_context_and_keeps_the_reports() -> None:
    step = _step()
    command = str(step["command"])
    assert 'buildkite-agent annotate --style "$$style" --context fxcache' in command
    assert step["artifact_paths"] == [".fxcache/results.json", ".fxcache/report.md",
                                      ".fxcache/junit.xml"]  # fmt: skip
    # Every variable is deferred to the job's shell: no single `$` left for upload time.
    assert "$" not in command.replace("$$", ""), command


@pytest.mark.slow
def test_the_step_runs_restores_verifies_saves_and_annotates(tmp_path: Path) -> None:
    doc = yaml.safe_load(PIPELINE.read_text())
    agent = tmp_path / "bin" / "buildkite-agent"
    agent.parent.mkdir()
    agent.write_text(AGENT)
    agent.chmod(0o755)
    work = tmp_path / "checkout"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FXCACHE_", "BUILDKITE"))}
    env.update({k: str(v) for k, v in doc["env"].items()})
    env.update({
        "PATH": f"{agent.parent}:{env['PATH']}", "ANNOTATE_OUT": str(tmp_path / "annotation"),
        "FXCACHE": str(Path(sys.executable).with_name("fxcache")), "FXCACHE_PYTHON": TORCH_PYTHON,
        "FXCACHE_ROOT": str(tmp_path / "store"), "TORCHINDUCTOR_COMPILE_THREADS": "1",
        "FXCACHE_VERIFY_ARGS": "--device cpu --dtypes float32 --dynamic false "
        "--mechanisms fxgraph --training false --workloads sin_matmul",
    })  # fmt: skip
    command = str(_step()["command"]).replace("$$", "$")
    proc = subprocess.run(["bash", "-c", command], cwd=work, env=env, capture_output=True,
                          text=True, timeout=900, check=False)  # fmt: skip
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    args = (tmp_path / "annotation.args").read_text().split("\n")
    assert args[:5] == ["annotate", "--style", "success", "--context", "fxcache"], args
    body = (tmp_path / "annotation.body").read_text()
    assert body == (work / ".fxcache/report.md").read_text() and "1/1 safe" in body
    results = json.loads((work / ".fxcache/results.json").read_text())
    assert [c["verdict"] for c in results["combos"]] == ["safe"]
    assert (work / ".fxcache/junit.xml").is_file()
    job_env = (work / ".fxcache/job-env.txt").read_text()
    assert job_env.startswith(f"TORCHINDUCTOR_CACHE_DIR={tmp_path / 'store'}"), job_env
    assert "fxcache: saved fxcache-v1-" in proc.stdout + proc.stderr
