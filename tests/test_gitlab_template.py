"""The GitLab CI template (ci/gitlab/fxcache.gitlab-ci.yml) under a local GitLab CI runner:
npm's gitlab-ci-local (tests/gitlab/, installed by the README's test command) with the shell
executor, in a project that includes the template and extends `.fxcache`, against the GitLab
API stand-in (tests/fake_gitlab.py). Two pipelines of a merge request: the first compiles
cold, runs the job's own step with the restored cache exported, saves, writes the JUnit
report artifact and creates the note; the second restores (hot only, a hit) and updates the
same note in place."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT, TORCH_PYTHON
from tests.fake_gitlab import FakeGitLab

TEMPLATE = "ci/gitlab/fxcache.gitlab-ci.yml"
RUNNER = ROOT / "tests/gitlab/node_modules/.bin/gitlab-ci-local"
PROJECT, IID, TOKEN = "42", 5, "glpat-template-test"
COMBO = "sin_matmul-cpu-float32-static-fxgraph-infer"
PIPELINE = """include:
  - local: ci/gitlab/fxcache.gitlab-ci.yml
train:
  extends: .fxcache
  script:
    - env | grep '^TORCHINDUCTOR_CACHE_DIR=' >.fxcache/job-env.txt
"""


def test_the_template_is_a_hidden_job_with_the_documented_reports() -> None:
    doc = yaml.safe_load((ROOT / TEMPLATE).read_text())
    assert list(doc) == [".fxcache"]
    job = doc[".fxcache"]
    assert job["artifacts"]["when"] == "always"
    assert job["artifacts"]["reports"]["junit"] == ".fxcache/junit.xml"
    after = "\n".join(job["after_script"])
    assert "save --state-file" in after and "comment .fxcache/results.json --gitlab" in after


def _project(base: Path) -> Path:
    src = base / "project"
    (src / "ci/gitlab").mkdir(parents=True)
    shutil.copy(ROOT / TEMPLATE, src / TEMPLATE)
    (src / ".gitlab-ci.yml").write_text(PIPELINE)
    git = ["git", "-C", str(src), "-c", "user.name=t", "-c", "user.email=t@invalid"]
    remote = "https://gitlab.example.com/group/project.git"
    for args in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-q", "-m", "t"],
                 ["remote", "add", "origin", remote]):  # fmt: skip
        subprocess.run([*git, *args], check=True, capture_output=True)
    return src


def _pipeline(src: Path, base: Path, gitlab: FakeGitLab) -> subprocess.CompletedProcess[str]:
    bin_dir = Path(sys.executable).parent
    variables = {
        "FXCACHE": str(bin_dir / "fxcache"), "FXCACHE_PYTHON": TORCH_PYTHON,
        "FXCACHE_VERIFY_ARGS": "--device cpu --dtypes float32 --dynamic false "
        "--mechanisms fxgraph --training false --workloads sin_matmul",
        "FXCACHE_ROOT": str(base / "store"), "TORCHINDUCTOR_COMPILE_THREADS": "1",
        "CI_API_V4_URL": gitlab.api_url, "CI_MERGE_REQUEST_IID": str(IID),
        "CI_MERGE_REQUEST_PROJECT_ID": PROJECT, "CI_MERGE_REQUEST_SOURCE_PROJECT_ID": PROJECT,
        "FXCACHE_GITLAB_TOKEN": TOKEN,
    }  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CI_", "GITLAB_", "FXCACHE_"))}
    env["GCL_IGNORE_PREDEFINED_VARS"] = "CI_API_V4_URL"
    argv = [str(RUNNER), "--home", str(base / "gcl-home"), "train"]
    argv += [arg for k, v in variables.items() for arg in ("--variable", f"{k}={v}")]
    return subprocess.run(
        argv, cwd=src, env=env, capture_output=True, text=True, timeout=900, check=False
    )


@pytest.mark.slow
def test_the_templates_job_under_gitlab_ci_local(tmp_path: Path) -> None:
    if not RUNNER.exists() or not shutil.which("rsync"):
        if os.environ.get("CI"):
            pytest.fail("gitlab-ci-local or rsync is missing: run the README's test command")
        pytest.skip("gitlab-ci-local (npm ci --prefix tests/gitlab) or rsync is not installed")
    src = _project(tmp_path)
    with FakeGitLab() as gitlab:
        gitlab.add_token(TOKEN, 901, "project_42_bot")
        gitlab.add_merge_request(PROJECT, IID)
        first = _pipeline(src, tmp_path, gitlab)
        log = first.stdout + first.stderr
        assert first.returncode == 0 and "PASS  train" in log, log[-6000:]
        # The report in the job log, the job's own step with the cache exported, the save.
        assert "sin_matmul cpu fp32 static fxgraph infer     safe" in log, log[-6000:]
        state = json.loads((src / ".fxcache/state.json").read_text())
        job_env = (src / ".fxcache/job-env.txt").read_text()
        assert job_env.startswith(f"TORCHINDUCTOR_CACHE_DIR={tmp_path / 'store'}"), job_env
        assert "fxcache: saved fxcache-v1-" in log, log[-6000:]
        # The JUnit report is among the job's artifacts (as GitLab collects them).
        junit = src / ".gitlab-ci-local/artifacts/train/.fxcache/junit.xml"
        assert junit.is_file() and COMBO in junit.read_text(), log[-6000:]
        results = json.loads((src / ".fxcache/results.json").read_text())
        assert results["settings"]["phase"] == "both"
        (note,) = gitlab.merge_requests[(PROJECT, IID)]
        assert "1/1 safe" in note["body"] and "created note" in log

        second = _pipeline(src, tmp_path, gitlab)
        log2 = second.stdout + second.stderr
        assert second.returncode == 0 and "PASS  train" in log2, log2[-6000:]
        results2 = json.loads((src / ".fxcache/results.json").read_text())
        assert results2["settings"]["phase"] == "hot", "the second job did not restore"
        state2 = json.loads((src / ".fxcache/state.json").read_text())
        assert state2["scope_key"] == state["scope_key"] and state2["hit"] is True, state2
        assert gitlab.merge_requests[(PROJECT, IID)] == [note] and "updated note" in log2
        assert gitlab.violations == []
