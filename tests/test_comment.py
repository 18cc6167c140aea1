"""`fxcache comment` against the strict local GitHub stand-in (tests/fake_github.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ci_fxcache.github_api import GitHubClient, GitHubError
from ci_fxcache.report import pr_comment
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
    return [c for c in fake.comments[PR] if pr_comment.marker(report_id) in str(c["body"])]


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
    assert "H200, sm90, torch 2.13.0+cu128 · sin\\_<wbr>matmul" in str(mine["body"])
    assert "✅ **Cache:** 7/12 safe; all but:" in str(mine["body"])
    assert (
        len(fake_github.calls("POST", r".*/comments")) == 1 and len(fake_github.calls("PATCH")) == 1
    )
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
        PR, f"{pr_comment.marker('fxcache')}\nold report", "github-actions[bot]"
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
    assert fake_github.calls("POST", r".*/comments") == []
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
    posts = fake_github.calls("POST", r".*/comments")
    assert [p.status for p in posts] == [422, 201]
    short, full = posts[1].body["body"], posts[0].body["body"]
    assert len(short) <= pr_comment.SHORT_LIMIT + len(pr_comment.marker("fxcache")) + 1 < len(full)
    body = str(_mine(fake_github)[0]["body"])
    assert "Shortened to fit 4,000 characters" in body
    assert "❌ **Do not cache:** bf16 dynamic precompile (wrong values on hot load)" in body


def test_fake_server_rejects_a_body_over_65536(fake_github: FakeGitHub) -> None:
    fake_github.add_pull(PR)
    client = GitHubClient(fake_github.token, fake_github.repository, fake_github.url)
    with pytest.raises(GitHubError) as info:
        pr_comment.upsert(client, PR, "x" * 70_000, "fxcache", "github-actions[bot]")
    assert info.value.status == 422 and "too long" in info.value.api_message


def test_duplicates_from_a_race_are_removed(fake_github: FakeGitHub) -> None:
    fake_github.add_pull(PR)
    for _ in range(3):
        fake_github.add_comment(PR, f"{pr_comment.marker('fxcache')}\nold", "github-actions[bot]")
    client = GitHubClient(fake_github.token, fake_github.repository, fake_github.url)
    action, _ = pr_comment.upsert(client, PR, "new", "fxcache", "github-actions[bot]")
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
    assert pr_comment.pull_number_from_event(str(path)) == number


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


def test_a_marker_in_someone_elses_comment_is_never_touched(
    fake_github: FakeGitHub, run_fxcache: RunFxcache, tmp_path: Path
) -> None:
    """A user who plants the hidden marker (before or after our comment) cannot get their
    comment edited into the report, nor get ours deleted as a 'duplicate'."""
    fake_github.add_pull(PR)
    planted = fake_github.add_comment(PR, f"{pr_comment.marker('fxcache')}\nall safe!", "mallory")
    env = _env(fake_github, tmp_path)
    first = run_fxcache("comment", RESULTS, env=env)
    assert first.returncode == 0 and "created comment" in first.stdout, first.stderr
    late = fake_github.add_comment(PR, f"{pr_comment.marker('fxcache')}\nfake", "mallory")
    second = run_fxcache("comment", RESULTS, env=env)
    assert second.returncode == 0 and "updated comment" in second.stdout, second.stderr
    touched = {c.path for c in fake_github.calls("PATCH") + fake_github.calls("DELETE")}
    ours = [c for c in fake_github.comments[PR] if c["user"]["login"] == "github-actions[bot]"]
    assert len(ours) == 1 and touched == {
        f"/repos/{fake_github.repository}/issues/comments/{ours[0]['id']}"
    }
    assert planted in fake_github.comments[PR] and late in fake_github.comments[PR]
    assert str(planted["body"]).endswith("all safe!") and str(late["body"]).endswith("fake")
    # GITHUB_TOKEN (an installation token) learns it is github-actions[bot] from GraphQL's
    # viewer; GET /user, which installation tokens cannot call, is never asked.
    assert fake_github.calls("GET", "/user") == []
    assert [c.status for c in fake_github.calls("POST", "/graphql")] == [200, 200]


def test_a_personal_token_matches_its_own_user(run_fxcache: RunFxcache, tmp_path: Path) -> None:
    with FakeGitHub(token="ghp_personal123", user="release-bot") as fake:
        fake.add_pull(PR)
        bots = fake.add_comment(PR, f"{pr_comment.marker('fxcache')}\nold", "github-actions[bot]")
        old = fake.add_comment(PR, f"{pr_comment.marker('fxcache')}\nold", "release-bot")
        proc = run_fxcache("comment", RESULTS, env=_env(fake, tmp_path))
        assert proc.returncode == 0 and "updated comment" in proc.stdout, proc.stderr
        (viewer,) = fake.calls("POST", "/graphql")
        assert viewer.status == 200
        (patch,) = fake.calls("PATCH")
        assert patch.path.endswith(f"/issues/comments/{old['id']}")
        assert fake.calls("DELETE") == [] and str(bots["body"]).endswith("old")
        assert fake.violations == []


def test_a_github_app_token_updates_only_its_own_comment(
    run_fxcache: RunFxcache, tmp_path: Path
) -> None:
    """A custom GitHub App's installation token (ghs_, like GITHUB_TOKEN) writes as
    `<slug>[bot]`: it finds its own comment through GraphQL's viewer, updates it on every run
    (no new comment per run) and never touches github-actions[bot]'s or a user's."""
    with FakeGitHub(token="ghs_appinstall456", bot="fxcache-ci[bot]") as fake:
        fake.add_pull(PR)
        tag = pr_comment.marker("fxcache")
        actions = fake.add_comment(PR, f"{tag}\nfrom GITHUB_TOKEN", "github-actions[bot]")
        user = fake.add_comment(PR, f"{tag}\nfrom a user", "alice")
        env = _env(fake, tmp_path)
        first = run_fxcache("comment", RESULTS, env=env)
        assert first.returncode == 0 and "created comment" in first.stdout, first.stderr
        second = run_fxcache("comment", RESULTS, env=env)
        assert second.returncode == 0 and "updated comment" in second.stdout, second.stderr
        ours = [c for c in fake.comments[PR] if c["user"]["login"] == "fxcache-ci[bot]"]
        assert len(ours) == 1, fake.comments[PR]
        (patch,) = fake.calls("PATCH")
        assert patch.path.endswith(f"/issues/comments/{ours[0]['id']}")
        assert fake.calls("DELETE") == [] and fake.calls("GET", "/user") == []
        assert str(actions["body"]).endswith("from GITHUB_TOKEN")
        assert str(user["body"]).endswith("from a user")
        assert fake.violations == []


def test_fake_server_graphql_serves_viewer_login_only() -> None:
    with FakeGitHub(token="ghs_app", bot="fxcache-ci[bot]") as fake:
        client = GitHubClient(fake.token, fake.repository, fake.url)
        assert client.graphql("query { viewer { login } }") == {
            "viewer": {"login": "fxcache-ci[bot]"}
        }
        with pytest.raises(GitHubError, match="fake serves only"):
            client.graphql('query { repository(owner: "o", name: "r") { id } }')
        assert len(fake.violations) == 1
    assert GitHubClient("t", "o/r", "https://ghe.example/api/v3").graphql_url == (
        "https://ghe.example/api/graphql"
    )


def test_author_can_be_given(fake_github: FakeGitHub, run_fxcache: RunFxcache,
                             tmp_path: Path) -> None:  # fmt: skip
    """--author names the login whose comments are ours (no GraphQL question then)."""
    fake_github.add_pull(PR)
    app = fake_github.add_comment(PR, f"{pr_comment.marker('fxcache')}\nold", "fxcache-app[bot]")
    proc = run_fxcache("comment", RESULTS, "--author", "fxcache-app[bot]",
                       env=_env(fake_github, tmp_path))  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    (patch,) = fake_github.calls("PATCH")
    assert patch.path.endswith(f"/issues/comments/{app['id']}")
    assert fake_github.calls("POST", "/graphql") == []


def test_fake_server_user_endpoint_follows_the_documented_api(fake_github: FakeGitHub) -> None:
    client = GitHubClient(fake_github.token, fake_github.repository, fake_github.url)
    with pytest.raises(GitHubError) as info:
        client.request("GET", "/user")
    assert info.value.status == 403
    assert info.value.api_message == "Resource not accessible by integration"
    with FakeGitHub(token="ghp_x", user="octocat") as fake:
        user = GitHubClient(fake.token, fake.repository, fake.url).request("GET", "/user").json()
        assert user["login"] == "octocat" and user["type"] == "User"
        with pytest.raises(GitHubError):
            GitHubClient(fake.token, fake.repository, fake.url).request(
                "GET", "/user", params={"a": 1}
            )
        assert fake.violations == ["GET /user: GET /user takes no query and no body"]


def _artifact(tmp_path: Path, name: str, report_id: str, pad: int = 0) -> str:
    folder = tmp_path / name
    folder.mkdir()
    doc = json.loads(Path(RESULTS).read_text())
    doc["report_id"] = report_id
    (folder / "results.json").write_text(json.dumps(doc))
    if pad:
        (folder / "padding").write_bytes(b"x" * pad)
    return str(folder / "results.json")


def test_artifact_report_id_must_match_its_name(
    fake_github: FakeGitHub, run_fxcache: RunFxcache, tmp_path: Path
) -> None:
    fake_github.add_pull(PR)
    env = _env(fake_github, tmp_path)
    ok = _artifact(tmp_path, "fxcache-report-nightly", "nightly")
    proc = run_fxcache("comment", ok, "--pr", str(PR), "--from-artifact",
                       "fxcache-report-nightly", env=env)  # fmt: skip
    assert proc.returncode == 0 and "report id 'nightly'" in proc.stdout, proc.stderr
    forged = _artifact(tmp_path, "fxcache-report-fleet", "nightly")
    bad = run_fxcache("comment", forged, "--pr", str(PR), "--from-artifact",
                      "fxcache-report-fleet", env=env)  # fmt: skip
    assert bad.returncode == 2
    assert "carries report id 'nightly', but its artifact fxcache-report-fleet names 'fleet'" in (
        bad.stderr
    )
    assert len(fake_github.calls("POST", r".*/comments")) == 1


@pytest.mark.parametrize("name", ["results", "fxcache-report-a b", "fxcache-report-"])
def test_artifact_with_a_bad_name_is_refused(
    fake_github: FakeGitHub, run_fxcache: RunFxcache, tmp_path: Path, name: str
) -> None:
    path = _artifact(tmp_path, "dir", "fxcache")
    proc = run_fxcache("comment", path, "--pr", str(PR), "--from-artifact", name,
                       env=_env(fake_github, tmp_path))  # fmt: skip
    assert proc.returncode == 2 and fake_github.requests == []


def test_oversized_artifact_is_refused_before_it_is_read(
    fake_github: FakeGitHub, run_fxcache: RunFxcache, tmp_path: Path
) -> None:
    path = _artifact(tmp_path, "fxcache-report-x", "x", pad=pr_comment.MAX_ARTIFACT_BYTES)
    proc = run_fxcache("comment", path, "--pr", str(PR), "--from-artifact", "fxcache-report-x",
                       env=_env(fake_github, tmp_path))  # fmt: skip
    assert proc.returncode == 2 and "more than 20971520" in proc.stderr
    assert fake_github.requests == []
