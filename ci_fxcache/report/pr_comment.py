"""The sticky pull-request comment: one comment per report id, found by a hidden marker.

Flow: find the pull request (event payload or --pr), render the markdown, list every page of
the PR's comments, PATCH the one that carries this report id's marker or POST a new one.
A fork's read-only token (403) is a warning that names the `workflow_run` follow-up, not a
failure: the job summary still has the report.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

from ci_fxcache import gha, names
from ci_fxcache.errors import CheckFailed, UsageError

if TYPE_CHECKING:
    from ci_fxcache.github_api import GitHubClient
    from ci_fxcache.report.model import Report
    from ci_fxcache.results.reader import Results

FORK_WORKFLOW = "workflows/fxcache-comment-fork.yml"
# GraphQL's `viewer` answers for every kind of token; GET /user does not for installation
# tokens (GITHUB_TOKEN, a custom GitHub App's), whose logins are `<app slug>[bot]`.
VIEWER_QUERY = "query { viewer { login } }"
# The fork follow-up posts artifacts named fxcache-report-<report id>, written by a fork's run:
# hostile input, refused above this size before it is read.
ARTIFACT_PREFIX = "fxcache-report-"
MAX_ARTIFACT_BYTES = 20 * 1024 * 1024
# Short enough to stay under GitHub's limit with the marker; a 422 retries with the short form.
SHORT_LIMIT = 4000


def marker(report_id: str) -> str:
    """The hidden line that identifies this report id's comment."""
    return f"<!-- fxcache-report:{report_id} -->"


def is_ours(body: str, report_id: str) -> bool:
    """Is `body` this report id's comment? Only when its first line is exactly the marker:
    `github-actions[bot]` writes every workflow's comments, and a marker quoted anywhere else
    (another workflow's comment, a log tail) must never make one ours."""
    return body.split("\n", 1)[0].rstrip("\r") == marker(report_id)


def neutralise_comments(text: str) -> str:
    """`<!--` in text from a document or a log can open no HTML comment (and so carry no
    marker): a zero-width space goes after its `<`, which shows the same."""
    return text.replace("<!--", "<\u200b!--")


def pull_number_from_event(path: str | None) -> int | None:
    """The pull request number of the current event, or None outside a pull request."""
    if not path:
        return None
    try:
        event = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read the event payload {path}: {exc}") from None
    if not isinstance(event, dict):
        return None
    pr = event.get("pull_request")
    if isinstance(pr, dict) and isinstance(pr.get("number"), int):
        return int(pr["number"])
    issue = event.get("issue")
    if (
        isinstance(issue, dict)
        and issue.get("pull_request")
        and isinstance(issue.get("number"), int)
    ):
        return int(issue["number"])
    run = event.get("workflow_run")
    if isinstance(run, dict):
        pulls = run.get("pull_requests") or []
        if pulls and isinstance(pulls[0], dict) and isinstance(pulls[0].get("number"), int):
            return int(pulls[0]["number"])
    return None


def token_author(client: GitHubClient) -> str:
    """The login that comments made with the client's token carry: `github-actions[bot]`
    for GITHUB_TOKEN, `<slug>[bot]` for a custom GitHub App's installation token, the user
    for a personal token (GraphQL `viewer { login }`)."""
    login = (client.graphql(VIEWER_QUERY).get("viewer") or {}).get("login")
    if not isinstance(login, str) or not login:
        raise UsageError("GitHub named no login for the token (viewer): pass --author LOGIN")
    return login


def upsert(
    client: GitHubClient, number: int, body: str, report_id: str, author: str
) -> tuple[str, int]:
    """Update this report id's comment on PR `number` or create it; ('updated'|'created', id).

    Only comments written by `author` (the token's own identity) whose first line is the
    marker count: a marker in anyone else's comment, or quoted anywhere in a body, is never
    edited or deleted, so nobody can plant a comment that we would later update (and its
    author could rewrite). Every page is searched; should a race have
    left duplicates of ours, the extra ones are deleted so that exactly one remains.
    """
    text = f"{marker(report_id)}\n{neutralise_comments(body)}"
    path = client.repo_path(f"issues/{number}/comments")
    mine = [
        c
        for c in client.paginate(path)
        if (c.get("user") or {}).get("login") == author
        and is_ours(str(c.get("body") or ""), report_id)
    ]
    if mine:
        keep = mine[0]
        client.request(
            "PATCH", client.repo_path(f"issues/comments/{keep['id']}"), json={"body": text}
        )
        for extra in mine[1:]:
            client.request("DELETE", client.repo_path(f"issues/comments/{extra['id']}"))
        return "updated", int(keep["id"])
    created = client.request("POST", path, json={"body": text}).json()
    return "created", int(created["id"])


def own_links_only(report: Report, results: Results, server: str, repository: str) -> None:
    """Keep the headline's commit and run links only when the document's `ci` names this
    run's own server and repository: a document from elsewhere (a fork's artifact) shows
    them as plain text, so the repository's bot never links to a host the document chose."""
    from ci_fxcache.report import model

    ci = model.ci_run(results)
    if (ci["server_url"], ci["repository"]) == (server.rstrip("/"), repository):
        return
    if report.headline is not None:
        report.headline.commit_url = report.headline.run_url = ""


def _render(
    results_path: str, template: str | None, max_chars: int, own: tuple[str, str]
) -> tuple[str, str]:
    """(markdown, report id) from a results document, or from a rendered .md file; links
    only to this run's own server and repository (`own`)."""
    if results_path.endswith(".md"):
        try:
            text = Path(results_path).read_text(encoding="utf-8")
        except OSError as exc:
            raise UsageError(f"{results_path}: cannot read: {exc.strerror}") from None
        if len(text) > max_chars:
            note = (
                "\n\n> [!NOTE]\n> Cut to fit a GitHub comment; the JSON results have everything.\n"
            )
            text = text[: max_chars - len(note)] + note
        return text, "fxcache"
    from ci_fxcache import report as report_pkg
    from ci_fxcache.report import render

    results, report = report_pkg.build(results_path)
    own_links_only(report, results, *own)
    budget = render.comment_budget(report, max_chars)
    return render.markdown(report, template, budget), report.report_id


def _with_job(body: str, path: str, limit: int, results: str | None = None) -> str:
    """The comment with the job's own figures under its status (job_line.under_status), when
    they fit; unchanged, with a warning, when the file is unreadable or holds no figures. The
    figures are checked first (jobstats/figures.py), as results are read before a report;
    advice names only mechanisms the `results` verified safe (none without them)."""
    from ci_fxcache.jobstats import figures
    from ci_fxcache.report import job_line

    try:
        doc = figures.checked(json.loads(Path(path).read_text(encoding="utf-8")))
    except (OSError, ValueError, RecursionError) as exc:
        gha.warn(f"--job-stats {path}: not read ({exc}); the comment has no job line")
        return body
    if doc is None:
        gha.warn(f"--job-stats {path}: not {figures.SCHEMA} figures; the comment has no job line")
        return body
    from ci_fxcache import report as report_pkg

    verified = report_pkg.safe_mechanisms(report_pkg.build(results)[1]) if results else frozenset()
    with_job = job_line.under_status(body, doc, verified)
    return with_job if len(with_job) <= limit else body


def render_body(
    results_path: str,
    template: str | None,
    limit: int,
    own: tuple[str, str],
    job_stats: str | None,
) -> tuple[str, str]:
    """(markdown, report id) of a comment or note: the report within `limit` characters, with
    the job's own figures under its status when given; links only to `own` (server,
    repository). The GitHub comment and the GitLab note (mr_note) both render here."""
    body, report_id = _render(results_path, template, limit, own)
    if job_stats is not None:
        body = _with_job(body, job_stats, limit, results_path)
    return body, report_id


def artifact_report_id(results_path: str, artifact: str) -> str:
    """The report id an artifact `fxcache-report-<id>` may carry, after checking its name and
    the total size of the directory holding RESULTS (the downloaded artifact)."""
    if not artifact.startswith(ARTIFACT_PREFIX):
        raise UsageError(f"artifact {artifact!r} is not an fxcache report ({ARTIFACT_PREFIX}<id>)")
    report_id = names.check_report_id(artifact[len(ARTIFACT_PREFIX) :])
    if not results_path.endswith(".json"):
        raise UsageError(
            f"{results_path}: an artifact's report must be its results JSON (rendered markdown "
            "from another run is never posted)"
        )
    folder = Path(results_path).parent
    total = 0
    for top, dirs, files in os.walk(folder):
        for path in [top, *(os.path.join(top, name) for name in [*dirs, *files])]:
            if os.path.islink(path):
                raise UsageError(
                    f"artifact {artifact} holds a symbolic link "
                    f"({os.path.relpath(path, folder)}): not reading it"
                )
        total += sum(os.lstat(os.path.join(top, f)).st_size for f in files)
    if total > MAX_ARTIFACT_BYTES:
        raise UsageError(
            f"artifact {artifact} holds {total} bytes, more than {MAX_ARTIFACT_BYTES}: not "
            "reading it"
        )
    return report_id


def _fork_warning(number: int, message: str) -> None:
    text = (
        f"cannot comment on pull request #{number}: {message}. A fork's pull_request run gets "
        "a read-only token whatever 'permissions:' says; the report is in the job summary. To "
        f"get the comment, add the workflow_run follow-up workflow {FORK_WORKFLOW} (it posts "
        "the uploaded report without running the PR's code); for same-repository PRs grant "
        "'permissions: pull-requests: write'."
    )
    gha.warn(text)
    gha.append_summary(f"> [!WARNING]\n> fxcache: {text}\n")


def _token(token_env: str) -> str:
    """The token in $`token_env` (GitHubClient masks it inside Actions); UsageError when
    there is none."""
    token = os.environ.get(token_env, "")
    if not token:
        raise UsageError(
            f"no token in ${token_env}: pass 'env: {token_env}: ${{{{ github.token }}}}' "
            "(with 'permissions: pull-requests: write') or choose another variable with --token-env"
        )
    return token


def post(
    *,
    results: str,
    report_id: str | None,
    token_env: str,
    pr: int | None,
    repo: str | None,
    author: str | None,
    from_artifact: str | None,
    template: str | None,
    job_stats: str | None,
    token: str | None,  # the token itself (the action's input), else $token_env's
) -> int:
    """Post or update the sticky comment; `fxcache comment` and the action's comment steps."""
    from ci_fxcache.github_api import GitHubClient, GitHubError
    from ci_fxcache.report import render

    number = pr or pull_number_from_event(os.environ.get("GITHUB_EVENT_PATH"))
    expected = artifact_report_id(results, from_artifact) if from_artifact else None
    limit = render.COMMENT_LIMIT - 200  # room for the marker line
    repository = repo or os.environ.get("GITHUB_REPOSITORY", "")
    own = (os.environ.get("GITHUB_SERVER_URL") or "https://github.com", repository)
    body, doc_report_id = render_body(results, template, limit, own, job_stats)
    if expected is not None and doc_report_id != expected:
        raise UsageError(
            f"{results} carries report id {doc_report_id!r}, but its artifact "
            f"{from_artifact} names {expected!r}: not commenting"
        )
    report_id = report_id or expected or names.check_report_id(doc_report_id)
    if number is None:
        event = os.environ.get("GITHUB_EVENT_NAME") or "no GitHub event"
        print(f"fxcache: not a pull request ({event}): no comment posted")
        return 0
    token = token or _token(token_env)
    client = GitHubClient(token, repository, os.environ.get("GITHUB_API_URL") or None)
    try:
        author = author or token_author(client)
        try:
            action, cid = upsert(client, number, body, report_id, author)
        except GitHubError as exc:
            if exc.status != 422:
                raise
            short, _ = _render(results, template, SHORT_LIMIT, own)
            gha.warn(f"GitHub refused the comment ({exc.api_message}); posting the short form")
            action, cid = upsert(client, number, short, report_id, author)
    except GitHubError as exc:
        if exc.status == 403:
            _fork_warning(number, exc.api_message)
            return 0
        if exc.status == 404:
            raise UsageError(
                f"pull request #{number} not found in {repository} (404 on {exc.method} "
                f"{exc.path}): check the PR number and that the token can read the repository"
            ) from None
        raise CheckFailed(str(exc)) from None
    print(f"fxcache: {action} comment {cid} on {repository}#{number} (report id {report_id!r})")
    return 0
