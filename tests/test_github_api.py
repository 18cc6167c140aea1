"""The shared GitHub REST client against the strict local stand-in server."""

from __future__ import annotations

import time

import pytest
import requests

from ci_fxcache.errors import UsageError
from ci_fxcache.github_api import GitHubClient, GitHubError
from tests.fake_github import FakeGitHub


def _client(fake: FakeGitHub, sleeps: list[float], **kw: object) -> GitHubClient:
    return GitHubClient(
        fake.token,
        fake.repository,
        fake.url,
        backoff_s=0.5,
        sleep=sleeps.append,
        **kw,  # type: ignore[arg-type]
    )


def test_paginates_every_page_one_request_each(fake_github: FakeGitHub) -> None:
    for i in range(250):
        fake_github.add_cache(f"fxcache-v1-linux-x86_64-cp311-torch2.13.0+cpu-cpu-{i:012x}")
    fake_github.add_cache("node-cache-linux")  # foreign key, filtered by the key prefix
    sleeps: list[float] = []
    client = _client(fake_github, sleeps)
    items = list(
        client.paginate(
            client.repo_path("actions/caches"),
            {"key": "fxcache-v1-", "sort": "last_accessed_at", "direction": "asc"},
            item_key="actions_caches",
        )
    )
    assert len(items) == 250 and len({c["id"] for c in items}) == 250
    calls = fake_github.calls("GET", r".*/actions/caches")
    assert len(calls) == 3
    assert all(c.query["per_page"] == ["100"] and c.query["key"] == ["fxcache-v1-"] for c in calls)
    assert [c.query.get("page", ["1"])[0] for c in calls] == ["1", "2", "3"]
    assert calls[0].headers["authorization"] == f"Bearer {fake_github.token}"
    assert calls[0].headers["x-github-api-version"] == "2022-11-28"
    assert sleeps == []


def test_retries_502_with_backoff(fake_github: FakeGitHub) -> None:
    fake_github.add_pull(7)
    fake_github.fail("GET", r".*/issues/7/comments", 502, {"message": "Server Error"}, times=2)
    sleeps: list[float] = []
    items = list(
        _client(fake_github, sleeps).paginate(f"/repos/{fake_github.repository}/issues/7/comments")
    )
    assert items == [] and sleeps == [0.5, 1.0]
    assert len(fake_github.calls("GET", r".*/issues/7/comments")) == 3


def test_gives_up_after_max_retries(fake_github: FakeGitHub) -> None:
    fake_github.fail("GET", r".*/actions/cache/usage", 503, times=10)
    sleeps: list[float] = []
    with pytest.raises(GitHubError) as err:
        _client(fake_github, sleeps, max_retries=2).request(
            "GET", f"/repos/{fake_github.repository}/actions/cache/usage"
        )
    assert err.value.status == 503 and len(sleeps) == 2


def test_secondary_rate_limit_honours_retry_after(fake_github: FakeGitHub) -> None:
    fake_github.fail(
        "GET",
        r".*/actions/cache/usage",
        429,
        {"message": "You have exceeded a secondary rate limit"},
        {"Retry-After": "3"},
    )
    sleeps: list[float] = []
    response = _client(fake_github, sleeps).request(
        "GET", f"/repos/{fake_github.repository}/actions/cache/usage"
    )
    assert response.json()["full_name"] == fake_github.repository and sleeps == [3.0]


def test_primary_rate_limit_waits_until_reset(fake_github: FakeGitHub) -> None:
    reset = int(time.time()) + 5
    fake_github.fail(
        "GET",
        r".*/actions/cache/usage",
        403,
        {"message": "API rate limit exceeded"},
        {"x-ratelimit-remaining": "0", "x-ratelimit-reset": str(reset)},
    )
    sleeps: list[float] = []
    _client(fake_github, sleeps).request(
        "GET", f"/repos/{fake_github.repository}/actions/cache/usage"
    )
    assert len(sleeps) == 1 and 3.0 <= sleeps[0] <= 7.0


def test_rate_limit_longer_than_bound_fails_fast(fake_github: FakeGitHub) -> None:
    fake_github.fail("GET", r".*/actions/cache/usage", 429, headers={"Retry-After": "3600"})
    sleeps: list[float] = []
    with pytest.raises(GitHubError) as err:
        _client(fake_github, sleeps, max_wait_s=60).request(
            "GET", f"/repos/{fake_github.repository}/actions/cache/usage"
        )
    assert err.value.status == 429 and sleeps == []


def test_permission_403_is_final_and_says_why(fake_github: FakeGitHub) -> None:
    fake_github.read_only = True
    cache = fake_github.add_cache("fxcache-v1-x")
    sleeps: list[float] = []
    with pytest.raises(GitHubError) as err:
        _client(fake_github, sleeps).request(
            "DELETE", f"/repos/{fake_github.repository}/actions/caches/{cache['id']}"
        )
    assert err.value.status == 403 and sleeps == []
    assert "Resource not accessible by integration" in str(err.value)
    assert fake_github.token not in str(err.value)


def test_validation_error_details_are_reported(fake_github: FakeGitHub) -> None:
    fake_github.add_pull(3)
    client = _client(fake_github, [])
    with pytest.raises(GitHubError) as err:
        client.request("POST", client.repo_path("issues/3/comments"), json={"body": "x" * 70000})
    assert err.value.status == 422 and "body is too long" in str(err.value)


def test_connection_refused_is_retried_then_reported() -> None:
    sleeps: list[float] = []
    client = GitHubClient(
        "t",
        "o/r",
        "http://127.0.0.1:9",
        backoff_s=0.01,
        max_retries=1,
        sleep=sleeps.append,
        timeout_s=2,
    )
    with pytest.raises(GitHubError) as err:
        client.request("GET", "/repos/o/r/actions/cache/usage")
    assert err.value.status == 0 and len(sleeps) == 1


def test_token_is_masked_inside_actions(
    fake_github: FakeGitHub, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    _client(fake_github, [])
    captured = capsys.readouterr()
    assert f"::add-mask::{fake_github.token}" in captured.err and captured.out == ""


def test_from_env_needs_repository_and_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GITHUB_REPOSITORY", raising=False)
    with pytest.raises(UsageError, match="GITHUB_REPOSITORY"):
        GitHubClient.from_env()
    monkeypatch.setenv("GITHUB_REPOSITORY", "o/r")
    monkeypatch.delenv("GITHUB_TOKEN", raising=False)
    with pytest.raises(UsageError, match="no GitHub token"):
        GitHubClient.from_env()
    with pytest.raises(UsageError, match="OWNER/NAME"):
        GitHubClient("t", "just-a-name")


def test_fake_server_rejects_requests_that_break_the_api(fake_github: FakeGitHub) -> None:
    # The stand-in must be able to fail: a request without GitHub's headers is refused.
    base = f"{fake_github.url}/repos/{fake_github.repository}"
    auth = {"Authorization": f"Bearer {fake_github.token}"}
    assert requests.get(f"{base}/actions/caches", headers=auth, timeout=5).status_code == 415
    headers = {
        **auth,
        "Accept": "application/vnd.github+json",
        "X-GitHub-Api-Version": "2022-11-28",
    }
    assert (
        requests.get(f"{base}/actions/caches?per_page=500", headers=headers, timeout=5).status_code
        == 422
    )
    assert (
        requests.get(f"{base}/actions/caches?bogus=1", headers=headers, timeout=5).status_code
        == 422
    )
    assert requests.put(f"{base}/actions/caches", headers=headers, timeout=5).status_code == 404
    assert requests.get(f"{base}/actions/cache/usage", timeout=5).status_code == 401
    assert len(fake_github.violations) == 5
    fake_github.violations.clear()  # expected here; the fixture asserts none are left
