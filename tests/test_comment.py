"""`fxcache comment` against the strict local GitHub stand-in (tests/fake_github.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ci_fxcache import comment
from ci_fxcache.github_api import GitHubClient, GitHubError
from tests.conftest import RunFxcache
from tests.fake_github import FakeGitHub

DATA = Path(__file__).parent / "data"
RESULTS = str(DATA / "results_h200.json")
PR = 7


def _env(
    fake: FakeGitHub, tmp_path: Path, event: dict[str, object] | None = None
) -> dict[str, str]:
    path = tmp_path / "event.json"
    path.write_text(json.dumps(event if event is not None else {"pull_request": {"number": PR}}))
    return {
        **fake.env(),
        "GITHUB_EVENT_PATH": str(path),
        "GITHUB_EVENT_NAME": "pull_request",
    }


def _mine(fake: FakeGitHub, report_id: str = "fxcache") -> list[dict[str, object]]:
    return [c for c in fake.comments[PR] if comment.marker(report_id) in str(c["body"])]


def test_creates_then_updates_one_comment(
    fake_github: FakeGitHub, run_fxcache: RunFxcache, tmp_path: Path
) -> None:
    fake_github.add_pull(PR)
    fake_github.add_comment(PR, "LGTM")
    env = _env(fake_github, tmp_path)
    first = run_fxcache("comment", RESULTS, env=env)
    assert first.returncode == 0, first.stderr
    assert "created comment" in first.stdout
    second = run_fxcache("comment", RESULTS, env=env)
    assert second.returncode == 0, second.stderr
    assert "updated comment" in second.stdout
    (mine,) = _mine(fake_github)
    assert "H200, sm90, torch 2.13.0+cu128 · sin\\_matmul" in str(mine["body"])
    assert "✅ **Cache:** fp32 static fxgraph" in str(mine["body"])
    assert len(fake_github.calls("POST")) == 1 and len(fake_github.calls("PATCH")) == 1
    assert len(fake_github.comments[PR]) == 2  # the human's comment is untouched
    # Another report id keeps its own comment.
    third = run_fxcache("comment", RESULTS, "--report-id", "nightly", env=env)
    assert third.returncode == 0 and "created comment" in third.stdout
    assert len(_mine(fake_github)) == 1 and len(_mine(fake_github, "nightly")) == 1


def test_finds_earlier_comment_on_page_two(
    fake_github: FakeGitHub, run_fxcache: RunFxcache, tmp_path: Path
) -> None:
    fake_github.add_pull(PR)
    for i in range(130):
        fake_github.add_comment(PR, f"comment {i}")
    old = fake_github.add_comment(
        PR, f"{comment.marker('fxcache')}\nold report", "github-actions[bot]"
    )
    for i in range(5):
        fake_github.add_comment(PR, f"later {i}")
    proc = run_fxcache("comment", RESULTS, env=_env(fake_github, tmp_path))
    assert proc.returncode == 0, proc.stderr
    lists = fake_github.calls("GET", rf".*/issues/{PR}/comments")
    assert [c.query.get("page", ["1"])[0] for c in lists] == ["1", "2"]
    assert all(c.query["per_page"] == ["100"] for c in lists)
    (patch,) = fake_github.calls("PATCH")
    assert patch.path.endswith(f"/issues/comments/{old['id']}")
    assert fake_github.calls("POST") == []
    assert len(_mine(fake_github)) == 1 and "old report" not in str(_mine(fake_github)[0]["body"])


def test_retries_502_then_succeeds(
    fake_github: FakeGitHub, run_fxcache: RunFxcache, tmp_path: Path
) -> None:
    fake_github.add_pull(PR)
    fake_github.fail("GET", rf".*/issues/{PR}/comments", 502, {"message": "Server Error"})
    proc = run_fxcache("comment", RESULTS, env=_env(fake_github, tmp_path))
    assert proc.returncode == 0, proc.stderr
    statuses = [c.status for c in fake_github.calls("GET")]
    assert statuses == [502, 200]
    assert len(_mine(fake_github)) == 1


def test_fork_403_warns_names_the_fix_and_exits_0(
    fake_github: FakeGitHub, run_fxcache: RunFxcache, tmp_path: Path
) -> None:
    fake_github.add_pull(PR)
    fake_github.read_only = True
    summary = tmp_path / "summary.md"
    env = {
        **_env(fake_github, tmp_path),
        "GITHUB_ACTIONS": "true",
        "GITHUB_STEP_SUMMARY": str(summary),
    }
    proc = run_fxcache("comment", RESULTS, env=env)
    assert proc.returncode == 0, proc.stderr
    (warning,) = [line for line in proc.stderr.splitlines() if line.startswith("::warning")]
    assert "Resource not accessible by integration" in warning
    assert "workflows/fxcache-comment-fork.yml" in warning and "workflow_run" in warning
    assert "workflows/fxcache-comment-fork.yml" in summary.read_text()
    # The token is masked and never printed otherwise.
    out = proc.stdout + proc.stderr
    assert f"::add-mask::{fake_github.token}" in proc.stderr
    leaks = [line for line in out.splitlines() if fake_github.token in line]
    assert leaks and all(line == f"::add-mask::{fake_github.token}" for line in leaks)
    assert _mine(fake_github) == []


def test_wrong_pull_request_404(
    fake_github: FakeGitHub, run_fxcache: RunFxcache, tmp_path: Path
) -> None:
    fake_github.add_pull(PR)
    proc = run_fxcache("comment", RESULTS, "--pr", "99", env=_env(fake_github, tmp_path))
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert "pull request #99 not found in octo-org/fxcache-demo" in line


def test_body_too_long_422_falls_back_to_short_form(
    fake_github: FakeGitHub, run_fxcache: RunFxcache, tmp_path: Path
) -> None:
    fake_github.add_pull(PR)
    too_long = {
        "message": "Validation Failed",
        "errors": [
            {
                "resource": "IssueComment",
                "code": "custom",
                "field": "body",
                "message": "body is too long (maximum is 65536 characters)",
            }
        ],
    }
    fake_github.fail("POST", rf".*/issues/{PR}/comments", 422, too_long)
    proc = run_fxcache("comment", RESULTS, env=_env(fake_github, tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert "body is too long" in proc.stderr and "short form" in proc.stderr
    posts = fake_github.calls("POST")
    assert [p.status for p in posts] == [422, 201]
    short, full = posts[1].body["body"], posts[0].body["body"]
    assert len(short) <= comment.SHORT_LIMIT + len(comment.marker("fxcache")) + 1 < len(full)
    body = str(_mine(fake_github)[0]["body"])
    assert "Shortened to fit 4,000 characters" in body
    assert "❌ **Do not cache:** bf16 dynamic precompile (wrong values on hot load)" in body


def test_fake_server_rejects_a_body_over_65536(fake_github: FakeGitHub) -> None:
    fake_github.add_pull(PR)
    client = GitHubClient(fake_github.token, fake_github.repository, fake_github.url)
    with pytest.raises(GitHubError) as info:
        comment.upsert(client, PR, "x" * 70_000, "fxcache")
    assert info.value.status == 422 and "too long" in info.value.api_message


def test_duplicates_from_a_race_are_removed(fake_github: FakeGitHub) -> None:
    fake_github.add_pull(PR)
    for _ in range(3):
        fake_github.add_comment(PR, f"{comment.marker('fxcache')}\nold")
    client = GitHubClient(fake_github.token, fake_github.repository, fake_github.url)
    action, _ = comment.upsert(client, PR, "new", "fxcache")
    assert action == "updated"
    (only,) = _mine(fake_github)
    assert str(only["body"]).endswith("\nnew")
    assert len(fake_github.calls("DELETE")) == 2


def test_outside_a_pull_request_does_nothing(
    fake_github: FakeGitHub, run_fxcache: RunFxcache, tmp_path: Path
) -> None:
    env = {**_env(fake_github, tmp_path, {"ref": "refs/heads/main"}), "GITHUB_EVENT_NAME": "push"}
    proc = run_fxcache("comment", RESULTS, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "not a pull request (push)" in proc.stdout
    assert fake_github.requests == []


def test_missing_token_is_a_usage_error(
    fake_github: FakeGitHub, run_fxcache: RunFxcache, tmp_path: Path
) -> None:
    env = _env(fake_github, tmp_path)
    env["MY_TOKEN"] = env.pop("GITHUB_TOKEN")
    proc = run_fxcache("comment", RESULTS, env=env)
    assert proc.returncode == 2 and "no token in $GITHUB_TOKEN" in proc.stderr
    fake_github.add_pull(PR)
    proc = run_fxcache("comment", RESULTS, "--token-env", "MY_TOKEN", env=env)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize(
    "event, number",
    [
        ({"pull_request": {"number": 12}}, 12),
        ({"issue": {"number": 5, "pull_request": {"url": "x"}}}, 5),
        ({"issue": {"number": 5}}, None),
        ({"workflow_run": {"pull_requests": [{"number": 9}]}}, 9),
        ({"workflow_run": {"pull_requests": []}}, None),
        ({"ref": "refs/heads/main"}, None),
    ],
)
def test_pull_number_from_event(
    tmp_path: Path, event: dict[str, object], number: int | None
) -> None:
    path = tmp_path / "e.json"
    path.write_text(json.dumps(event))
    assert comment.pull_number_from_event(str(path)) == number


def test_comments_a_captured_verify_document(
    fake_github: FakeGitHub, run_fxcache: RunFxcache, tmp_path: Path
) -> None:
    fake_github.add_pull(PR)
    real = str(DATA / "verify_real_cpu.json")
    proc = run_fxcache("comment", real, env=_env(fake_github, tmp_path))
    assert proc.returncode == 0, proc.stderr
    (mine,) = _mine(fake_github)
    assert "✅ **Cache:** nothing passed verification" in str(mine["body"])
    assert "\nCPU x86\\_64 " in str(mine["body"])
