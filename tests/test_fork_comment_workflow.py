"""workflows/fxcache-comment-fork.yml's script, run as the runner runs it, against stand-ins
for `gh` (the pull request lookup) and `fxcache` (recording what it is asked to post). The
artifact it reads comes from a fork's run, so it is treated as hostile."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT

HEAD_SHA = "0123456789abcdef0123456789abcdef01234567"


def _script() -> tuple[str, dict[str, str]]:
    doc = yaml.safe_load((ROOT / "workflows/fxcache-comment-fork.yml").read_text())
    steps = doc["jobs"]["comment"]["steps"]
    step = next(s for s in steps if s.get("name") == "Comment")
    return step["run"], step["env"]


def _run(tmp_path: Path, artifacts: dict[str, dict[str, str]], pr_head: str = HEAD_SHA) -> tuple[
    subprocess.CompletedProcess[str], list[list[str]]
]:  # fmt: skip
    reports = tmp_path / "reports"
    for name, files in artifacts.items():
        (reports / name).mkdir(parents=True)
        for fname, text in files.items():
            (reports / name / fname).write_text(text)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    (bin_dir / "gh").write_text(f"#!/bin/sh\necho '{pr_head}'\n")
    (bin_dir / "fxcache").write_text(f'#!/bin/sh\necho "$*" >> "{calls}"\n')
    for exe in bin_dir.iterdir():
        exe.chmod(0o755)
    script, declared = _script()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GITHUB_")}
    values = {
        "FXCACHE": str(bin_dir / "fxcache"),
        "REPORTS": str(reports),
        "HEAD_SHA": HEAD_SHA,
        "GITHUB_TOKEN": "t",
        "GH_TOKEN": "t",
    }
    assert set(values) == set(declared)
    env.update(values, GITHUB_REPOSITORY="octo-org/demo", PATH=f"{bin_dir}:{env['PATH']}")
    proc = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", script],
                          env=env, capture_output=True, text=True, check=False)  # fmt: skip
    posted = [line.split() for line in calls.read_text().splitlines()] if calls.exists() else []
    return proc, posted


def test_posts_each_report_with_its_pr_and_report_id(tmp_path: Path) -> None:
    proc, posted = _run(
        tmp_path,
        {
            "fxcache-report-fxcache": {"results.json": "{}", "pr-number": "7\n"},
            "fxcache-report-fleet": {"results.json": "{}", "pr-number": "7"},
        },
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    reports = tmp_path / "reports"
    assert sorted(posted) == sorted(
        [
            ["comment", f"{reports}/fxcache-report-fleet/results.json", "--pr", "7",
             "--from-artifact", "fxcache-report-fleet"],
            ["comment", f"{reports}/fxcache-report-fxcache/results.json", "--pr", "7",
             "--from-artifact", "fxcache-report-fxcache"],
        ]
    )  # fmt: skip


@pytest.mark.parametrize("pr", ["7; rm -rf /", "", "../7", "$(id)"])
def test_a_tampered_pr_number_posts_nothing(tmp_path: Path, pr: str) -> None:
    proc, posted = _run(tmp_path, {"fxcache-report-x": {"results.json": "{}", "pr-number": pr}})
    assert proc.returncode == 1
    assert "::error::fxcache:" in proc.stdout and "pr-number is not a number" in proc.stdout
    assert posted == []


def test_a_pr_at_another_commit_gets_no_comment(tmp_path: Path) -> None:
    """A fork cannot aim the comment at another pull request: its head must be the run's."""
    proc, posted = _run(
        tmp_path, {"fxcache-report-x": {"results.json": "{}", "pr-number": "8"}}, pr_head="f00"
    )
    assert proc.returncode == 1
    assert f"pull request #8 is not open at commit {HEAD_SHA}" in proc.stdout
    assert posted == []
