"""`fxcache comment --gitlab`: the sticky merge-request note against the strict local GitLab
stand-in (tests/fake_gitlab.py): created, then updated in place; found on a later page; a
fork's merge request (the note goes to the merge request's own project); API errors, a job
token, no token and no merge request are one line and exit 0."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from ci_fxcache.report import pr_comment
from tests.conftest import RunFxcache
from tests.fake_gitlab import FakeGitLab, User

RESULTS = str(Path(__file__).parent / "data" / "results_h200.json")
PROJECT, IID, TOKEN = "42", 5, "glpat-fxcache-test"
BOT = User(901, "project_42_bot_fxcache")


@pytest.fixture
def gitlab() -> Iterator[FakeGitLab]:
    with FakeGitLab() as server:
        server.add_token(TOKEN, BOT.id, BOT.username)
        server.add_merge_request(PROJECT, IID)
        yield server


def _env(server: FakeGitLab, **changes: str) -> dict[str, str]:
    env = {
        "CI": "true", "GITLAB_CI": "true", "CI_API_V4_URL": server.api_url,
        "CI_SERVER_URL": server.url, "CI_PROJECT_PATH": "group/project",
        "CI_PROJECT_ID": PROJECT, "CI_MERGE_REQUEST_PROJECT_ID": PROJECT,
        "CI_MERGE_REQUEST_SOURCE_PROJECT_ID": PROJECT, "CI_MERGE_REQUEST_IID": str(IID),
        "CI_JOB_TOKEN": "job-token", "FXCACHE_GITLAB_TOKEN": TOKEN,
    }  # fmt: skip
    return {**env, **changes}


def _ours(server: FakeGitLab, project: str = PROJECT) -> list[dict[str, object]]:
    return [
        n
        for n in server.merge_requests[(project, IID)]
        if str(n["body"]).startswith(pr_comment.marker("fxcache") + "\n")
    ]


def test_creates_then_updates_one_note_in_place(
    gitlab: FakeGitLab, run_fxcache: RunFxcache
) -> None:
    human = gitlab.add_note(PROJECT, IID, "Looks good", User(7, "alice"))
    first = run_fxcache("comment", RESULTS, "--gitlab", env=_env(gitlab))
    assert first.returncode == 0, first.stderr
    assert (
        "fxcache: created note" in first.stdout and "merge request !5 of project 42" in first.stdout
    )
    second = run_fxcache("comment", RESULTS, "--gitlab", env=_env(gitlab))
    assert second.returncode == 0 and "fxcache: updated note" in second.stdout, second.stderr
    (note,) = _ours(gitlab)
    assert "✅ **Cache:** 7/12 safe; all but:" in str(note["body"])
    assert gitlab.merge_requests[(PROJECT, IID)] == [human, note]
    notes = rf"/api/v4/projects/{PROJECT}/merge_requests/{IID}/notes"
    assert len(gitlab.calls("POST", notes)) == 1
    assert gitlab.calls("PUT") == [f"{notes}/{note['id']}"]
    assert all(headers.get("PRIVATE-TOKEN") == TOKEN for _, _, headers in gitlab.requests)
    assert gitlab.violations == []


def test_finds_its_note_on_a_later_page_and_leaves_others_alone(
    gitlab: FakeGitLab, run_fxcache: RunFxcache
) -> None:
    alice = User(7, "alice")
    for i in range(105):
        gitlab.add_note(PROJECT, IID, f"comment {i}", alice)
    # The marker in someone else's note, a system note, and ours on page two.
    planted = gitlab.add_note(PROJECT, IID, pr_comment.marker("fxcache") + "\nplanted", alice)
    gitlab.add_note(PROJECT, IID, pr_comment.marker("fxcache") + "\nsystem", BOT, system=True)
    ours = gitlab.add_note(PROJECT, IID, pr_comment.marker("fxcache") + "\nold", BOT)
    proc = run_fxcache("comment", RESULTS, "--gitlab", env=_env(gitlab))
    assert proc.returncode == 0 and f"updated note {ours['id']}" in proc.stdout, proc.stderr
    assert planted["body"].endswith("planted") and "7/12 safe" in str(ours["body"])
    assert len(gitlab.calls("GET", r".*/notes")) == 2  # page two through the Link header
    assert gitlab.violations == []


def test_a_forks_merge_request_gets_the_note_in_its_own_project(
    gitlab: FakeGitLab, run_fxcache: RunFxcache
) -> None:
    """A fork's merge request whose pipeline runs in the fork (project 77): the merge request
    lives in the target project 42, CI_MERGE_REQUEST_PROJECT_ID, where the note goes."""
    env = _env(gitlab, CI_PROJECT_ID="77", CI_MERGE_REQUEST_SOURCE_PROJECT_ID="77",
               CI_PROJECT_PATH="someone/project")  # fmt: skip
    proc = run_fxcache("comment", RESULTS, "--gitlab", env=env)
    assert proc.returncode == 0 and "created note" in proc.stdout, proc.stderr
    assert len(_ours(gitlab)) == 1
    assert not [p for _, p, _ in gitlab.requests if "/projects/77/" in p]
    assert gitlab.violations == []


@pytest.mark.parametrize(
    ("changes", "args", "words"),
    [({}, ["--token-env", "CI_JOB_TOKEN"], "GitLab API GET /api/v4/user -> 403"),
     ({"FXCACHE_GITLAB_TOKEN": "revoked"}, [], "GitLab API GET /api/v4/user -> 401"),
     ({"FXCACHE_GITLAB_TOKEN": ""}, [], "$FXCACHE_GITLAB_TOKEN is empty"),
     ({"CI_MERGE_REQUEST_IID": ""}, [], "not a merge request pipeline"),
     ({"CI_MERGE_REQUEST_PROJECT_ID": "43"}, [], "/projects/43/merge_requests/5/notes -> 404")],
)  # fmt: skip
def test_no_note_is_one_line_and_exit_0(
    gitlab: FakeGitLab, run_fxcache: RunFxcache, changes: dict[str, str], args: list[str],
    words: str,
) -> None:  # fmt: skip
    proc = run_fxcache("comment", RESULTS, "--gitlab", *args, env=_env(gitlab, **changes))
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.startswith("fxcache: no merge-request note: ") and words in proc.stderr
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert _ours(gitlab) == [] and gitlab.violations == []


def test_a_server_error_is_retried_once_then_one_line(
    gitlab: FakeGitLab, run_fxcache: RunFxcache
) -> None:
    gitlab.fail = 500
    proc = run_fxcache("comment", RESULTS, "--gitlab", env=_env(gitlab))
    assert proc.returncode == 0 and proc.stderr.count("\n") == 1, proc.stderr
    assert "notes -> 500: 500 injected" in proc.stderr
    assert len(gitlab.calls("GET", r".*/notes")) == 2


def test_github_only_options_are_refused_with_gitlab(
    gitlab: FakeGitLab, run_fxcache: RunFxcache
) -> None:
    proc = run_fxcache("comment", RESULTS, "--gitlab", "--repo", "a/b", env=_env(gitlab))
    assert proc.returncode == 2 and "--repo: GitHub only, not with --gitlab" in proc.stderr


def test_the_fake_follows_the_documented_notes_api(gitlab: FakeGitLab) -> None:
    """The stand-in is strict: form-encoded bodies, fields besides `body`, an Authorization header
    or an endpoint the note does not use are violations."""
    url = f"{gitlab.api_url}/projects/{PROJECT}/merge_requests/{IID}/notes"
    auth = {"PRIVATE-TOKEN": TOKEN}
    assert requests.post(url, data={"body": "x"}, headers=auth, timeout=5).status_code == 400
    extra = requests.post(url, json={"body": "x", "internal": 1}, headers=auth, timeout=5)
    assert extra.status_code == 400
    assert requests.get(url, params={"per_page": 500}, headers=auth, timeout=5).status_code == 400
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    assert requests.get(url, headers=bearer, timeout=5).status_code == 401
    assert len(gitlab.violations) == 4, gitlab.violations
    created = requests.post(url, json={"body": "x"}, headers=auth, timeout=5)
    assert created.status_code == 201 and created.json()["author"]["id"] == BOT.id
    other = {"PRIVATE-TOKEN": "other"}
    gitlab.add_token("other", 8, "bob")
    put = requests.put(
        f"{url}/{created.json()['id']}", json={"body": "y"}, headers=other, timeout=5
    )
    assert put.status_code == 403  # only the author edits a note
