"""Issue 26 §4 and §6: the sticky comment is found by its first line only; no text from a
document or log carries a marker; a fork's artifact with a symbolic link is never read.

Against the strict local GitHub stand-in (tests/fake_github.py), through the real command.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from ci_fxcache.report import pr_comment
from tests.conftest import RunFxcache
from tests.fake_github import FakeGitHub

DATA = Path(__file__).parent / "data"
RESULTS = DATA / "results_h200.json"
PR = 7
BOT = "github-actions[bot]"


def _env(fake: FakeGitHub, tmp_path: Path) -> dict[str, str]:
    path = tmp_path / "event.json"
    path.write_text(json.dumps({"pull_request": {"number": PR}}))
    return {**fake.env(), "GITHUB_EVENT_PATH": str(path), "GITHUB_EVENT_NAME": "pull_request"}


def _artifact(tmp_path: Path, name: str, doc: dict) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "results.json").write_text(json.dumps(doc))
    return folder


def test_another_workflows_comment_quoting_the_marker_is_not_overwritten(
    fake_github: FakeGitHub, run_fxcache: RunFxcache, tmp_path: Path
) -> None:
    fake_github.add_pull(PR)
    quoted = (
        f"Nightly digest. fxcache's comments start with\n> {pr_comment.marker('fxcache')}\n"
        "and are left to it."
    )
    other = fake_github.add_comment(PR, quoted, BOT)  # same bot: every workflow's comments
    inline = fake_github.add_comment(PR, f"see {pr_comment.marker('fxcache')} above", BOT)
    proc = run_fxcache("comment", str(RESULTS), env=_env(fake_github, tmp_path))
    assert proc.returncode == 0 and "created comment" in proc.stdout, proc.stderr
    assert fake_github.calls("PATCH") == [] and fake_github.calls("DELETE") == []
    assert other["body"] == quoted and other in fake_github.comments[PR]
    assert inline in fake_github.comments[PR]
    ours = [c for c in fake_github.comments[PR] if pr_comment.is_ours(c["body"], "fxcache")]
    assert len(ours) == 1 and ours[0] is not other
    # The next run finds its own comment by its first line and edits only that one.
    again = run_fxcache("comment", str(RESULTS), env=_env(fake_github, tmp_path))
    assert again.returncode == 0 and "updated comment" in again.stdout
    (patch,) = fake_github.calls("PATCH")
    assert patch.path.endswith(f"/issues/comments/{ours[0]['id']}")


def test_a_forks_log_tail_cannot_carry_another_report_ids_marker(
    fake_github: FakeGitHub, run_fxcache: RunFxcache, tmp_path: Path
) -> None:
    """The fork's results (posted by the workflow_run follow-up with the base token) carry
    `<!-- fxcache-report:other -->` in a log tail; the next legitimate `other` run must create
    its own comment, not edit the fork's (and delete the real one as a duplicate)."""
    fake_github.add_pull(PR)
    env = _env(fake_github, tmp_path)
    real = run_fxcache("comment", str(RESULTS), "--report-id", "other", env=env)
    assert real.returncode == 0 and "created comment" in real.stdout, real.stderr
    (real_comment,) = fake_github.comments[PR]
    doc = json.loads(RESULTS.read_text())
    doc["report_id"] = "fork"
    unsafe = next(c for c in doc["combos"] if c["verdict"] == "unsafe")
    planted = f"{pr_comment.marker('other')}\nAll combinations safe."
    unsafe["cold"]["log_tail"] = f"{planted}\n" + unsafe["cold"]["log_tail"]
    unsafe["reason"] = f"{pr_comment.marker('other')} <!-- x"
    folder = _artifact(tmp_path, "fxcache-report-fork", doc)
    fork = run_fxcache("comment", str(folder / "results.json"), "--pr", str(PR),
                       "--from-artifact", folder.name, env=env)  # fmt: skip
    assert fork.returncode == 0 and "created comment" in fork.stdout, fork.stderr
    fork_comment = fake_github.comments[PR][-1]
    assert "<!--" not in fork_comment["body"].split("\n", 1)[1]
    assert "All combinations safe." in fork_comment["body"]  # the log tail is there, defused
    nxt = run_fxcache("comment", str(RESULTS), "--report-id", "other", env=env)
    assert nxt.returncode == 0 and "updated comment" in nxt.stdout, nxt.stderr
    (patch,) = fake_github.calls("PATCH")
    assert patch.path.endswith(f"/issues/comments/{real_comment['id']}")
    assert fake_github.calls("DELETE") == []
    assert fork_comment in fake_github.comments[PR]


@pytest.mark.parametrize("where", ["results", "subdir", "file", "folder"])
def test_an_artifact_holding_a_symlink_is_refused_before_it_is_read(
    fake_github: FakeGitHub, run_fxcache: RunFxcache, tmp_path: Path, where: str
) -> None:
    fake_github.add_pull(PR)
    doc = json.loads(RESULTS.read_text())
    doc["report_id"] = "x"
    outside = tmp_path / "outside.json"  # a valid report elsewhere: read through the link
    outside.write_text(json.dumps(doc))
    folder = tmp_path / "fxcache-report-x"
    if where == "folder":
        real = _artifact(tmp_path, "elsewhere", doc)
        os.symlink(real, folder)
    else:
        folder.mkdir()
        if where == "results":
            os.symlink(outside, folder / "results.json")
        else:
            (folder / "results.json").write_text(json.dumps(doc))
            target = tmp_path if where == "subdir" else outside
            os.symlink(target, folder / "link")
    proc = run_fxcache("comment", str(folder / "results.json"), "--pr", str(PR),
                       "--from-artifact", folder.name, env=_env(fake_github, tmp_path))  # fmt: skip
    assert proc.returncode == 2, proc.stdout
    assert "holds a symbolic link" in proc.stderr and len(proc.stderr.splitlines()) == 1
    assert fake_github.requests == []


def test_an_artifact_must_carry_results_json_not_markdown(
    fake_github: FakeGitHub, run_fxcache: RunFxcache, tmp_path: Path
) -> None:
    fake_github.add_pull(PR)
    folder = tmp_path / "fxcache-report-fxcache"
    folder.mkdir()
    (folder / "report.md").write_text("<h1>APPROVED BY MAINTAINERS</h1>\n")
    proc = run_fxcache("comment", str(folder / "report.md"), "--pr", str(PR),
                       "--from-artifact", folder.name, env=_env(fake_github, tmp_path))  # fmt: skip
    assert proc.returncode == 2 and "never posted" in proc.stderr
    assert fake_github.requests == []


@pytest.mark.parametrize(
    ("server", "repository", "linked"),
    [
        ("https://github.com", "octo-org/fxcache-demo", True),  # this run's own
        ("https://github.com", "acme-ml/train-stack", False),  # another repository
        ("https://phish.example", "octo-org/fxcache-demo", False),  # another host
    ],
)
def test_the_comment_links_only_to_the_posting_runs_own_repository(
    fake_github: FakeGitHub, run_fxcache: RunFxcache, tmp_path: Path, server: str,
    repository: str, linked: bool,
) -> None:  # fmt: skip
    """Issue 32: a document's `ci` (a fork's artifact, say) picks the commit and run links'
    host and repository; the bot links them only when they are the posting run's own, and
    shows the plain commit and run otherwise."""
    fake_github.add_pull(PR)
    doc = json.loads(RESULTS.read_text())
    doc["ci"].update(server_url=server, repository=repository)
    path = tmp_path / "results.json"
    path.write_text(json.dumps(doc))
    env = {**_env(fake_github, tmp_path), "GITHUB_SERVER_URL": "https://github.com"}
    proc = run_fxcache("comment", str(path), env=env)
    assert proc.returncode == 0, proc.stderr
    (comment,) = fake_github.comments[PR]
    first = comment["body"].splitlines()[1]
    own = f"https://github.com/octo-org/fxcache-demo/commit/{doc['ci']['sha']}"
    assert (f"[abc1234]({own})" in first) is linked, first
    assert "phish.example" not in comment["body"] and "acme-ml/train-stack/" not in first
    assert "abc1234" in first and "123" in first
