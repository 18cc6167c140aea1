"""`report`, `merge` and `comment` on the output of a real `fxcache verify` run (real compiles)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import TORCH_PYTHON, RunFxcache
from tests.fake_github import FakeGitHub

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def verified(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One real combination compiled cold and hot on the CPU, plus a cuda one that skips."""
    import subprocess
    import sys

    from tests.conftest import _clean_env

    work = tmp_path_factory.mktemp("verify")
    out = work / "results.json"
    argv = [
        *("--device", "cpu,cuda", "--dtypes", "float32", "--dynamic", "false"),
        *("--mechanisms", "fxgraph", "--workloads", "sin_matmul", "--jobs", "1"),
        *("--cache-dir", str(work / "cache"), "--json", str(out), "--fail-on", "never"),
    ]
    proc = subprocess.run(
        [sys.executable, "-m", "ci_fxcache", "verify", "--python", TORCH_PYTHON, *argv],
        capture_output=True,
        text=True,
        env=_clean_env({"TORCHINDUCTOR_COMPILE_THREADS": "1"}),
        timeout=900,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out


def test_report_renders_real_verify_output(
    verified: Path, run_fxcache: RunFxcache, tmp_path: Path
) -> None:
    from junitparser import JUnitXml

    doc = json.loads(verified.read_text())
    assert doc["schema"] == "fxcache-results/2"
    (cpu,) = [c for c in doc["combos"] if c["device"] == "cpu"]
    proc = run_fxcache("report", str(verified), "--format", "md")
    assert proc.returncode == 0, proc.stderr
    md = proc.stdout
    assert md.splitlines()[2].startswith("CPU ")
    verdict_cell = {
        "safe": "✅&nbsp;safe",
        "no-gain": "🟡&nbsp;no\u2011gain",
        "unsafe": "❌&nbsp;unsafe",
    }
    assert f"| {verdict_cell.get(cpu['verdict'], cpu['verdict'])} |" in md
    assert "⏭️ 1 skipped" in md and "no CUDA device" in md

    junit = tmp_path / "junit.xml"
    proc = run_fxcache("report", str(verified), "--format", "junit", "-o", str(junit))
    assert proc.returncode == 0, proc.stderr
    cases = {case.name: case for suite in JUnitXml.fromfile(str(junit)) for case in suite}
    assert set(cases) == {c["id"] for c in doc["combos"]}

    summary, outputs = tmp_path / "summary.md", tmp_path / "outputs"
    env = {
        "GITHUB_ACTIONS": "true",
        "GITHUB_STEP_SUMMARY": str(summary),
        "GITHUB_OUTPUT": str(outputs),
    }
    proc = run_fxcache(
        "report", str(verified), "--format", "md", "-o", str(tmp_path / "r.md"), env=env
    )
    assert proc.returncode == 0, proc.stderr
    assert summary.read_text() == (tmp_path / "r.md").read_text() == md
    text = outputs.read_text()
    safe = [cpu["id"]] if cpu["verdict"] == "safe" else []
    assert json.dumps(safe) in text and "report-markdown<<" in text


def test_merge_and_comment_on_real_verify_output(
    verified: Path, run_fxcache: RunFxcache, fake_github: FakeGitHub, tmp_path: Path
) -> None:
    merged = tmp_path / "all.json"
    shard = Path(__file__).parent / "data" / "shard_h200.json"
    proc = run_fxcache("merge", str(verified), str(shard), "-o", str(merged))
    assert proc.returncode == 0, proc.stderr
    groups = json.loads(merged.read_text())["groups"]
    assert [g["arch"] for g in groups] == ["cpu", "sm90"]

    fake_github.add_pull(3)
    event = tmp_path / "event.json"
    event.write_text(json.dumps({"pull_request": {"number": 3}}))
    env = {**fake_github.env(), "GITHUB_EVENT_PATH": str(event)}
    for _ in range(2):
        proc = run_fxcache("comment", str(merged), env=env)
        assert proc.returncode == 0, proc.stderr
    (only,) = fake_github.comments[3]
    body = only["body"]
    assert "\n### fxcache: " in body and "\n- **cpu**, " in body and "\n- **sm90** H200" in body
