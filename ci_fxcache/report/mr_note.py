"""The sticky GitLab merge-request note: `fxcache comment --gitlab`, the GitLab CI template's
last step (ci/gitlab/fxcache.gitlab-ci.yml). One note per report id, recognised by the same
first line as the GitHub comment (pr_comment.is_ours), written by the token's own user.

Where it goes: the merge request CI_MERGE_REQUEST_IID of project CI_MERGE_REQUEST_PROJECT_ID
(the project the merge request lives in; a fork's merge request may run its pipeline in the
fork, where CI_PROJECT_ID is the fork's), through CI_API_V4_URL. The token: a project or group
access token with `api` scope in a masked variable (CI_JOB_TOKEN cannot write notes). The note
never fails the job: no merge request, no token or an API error is one line and exit 0.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ci_fxcache import names
from ci_fxcache.report import pr_comment

if TYPE_CHECKING:
    from ci_fxcache.report.gitlab_api import GitLabClient

TOKEN_ENV = "FXCACHE_GITLAB_TOKEN"  # the default variable holding the access token


@dataclass(frozen=True)
class MergeRequest:
    """Where the note goes: the merge request's own project and its iid."""

    api_url: str
    project_id: str
    iid: int

    @property
    def notes_path(self) -> str:
        return f"/projects/{self.project_id}/merge_requests/{self.iid}/notes"


def merge_request_from_env(env: dict[str, str], iid: int | None = None) -> MergeRequest | None:
    """The merge request of this pipeline (or merge request `iid` of the pipeline's project),
    None outside a merge request pipeline."""
    api_url = env.get("CI_API_V4_URL", "")
    number = iid if iid is not None else env.get("CI_MERGE_REQUEST_IID", "")
    project = env.get("CI_MERGE_REQUEST_PROJECT_ID") or env.get("CI_PROJECT_ID", "")
    if not (api_url and project and str(number).isdigit()):
        return None
    return MergeRequest(api_url=api_url, project_id=project, iid=int(number))


def upsert_note(
    client: GitLabClient, mr: MergeRequest, body: str, report_id: str, author_id: int
) -> tuple[str, int]:
    """Update this report id's note or create it; ('updated'|'created', note id). Only notes
    by `author_id` (the token's user) whose first line is the marker count; should a race
    have left two, the later ones are deleted."""
    text = f"{pr_comment.marker(report_id)}\n{pr_comment.neutralise_comments(body)}"
    mine = [
        n
        for n in client.paginate(mr.notes_path)
        if not n.get("system")
        and (n.get("author") or {}).get("id") == author_id
        and pr_comment.is_ours(str(n.get("body") or ""), report_id)
    ]
    if mine:
        keep = mine[0]
        client.request("PUT", f"{mr.notes_path}/{keep['id']}", json={"body": text})
        for extra in mine[1:]:
            client.request("DELETE", f"{mr.notes_path}/{extra['id']}")
        return "updated", int(keep["id"])
    created = client.request("POST", mr.notes_path, json={"body": text}).json()
    return "created", int(created["id"])


def _skip(text: str) -> int:
    print(f"fxcache: no merge-request note: {text}", file=sys.stderr)
    return 0


def post(
    *,
    results: str,
    report_id: str | None,
    token_env: str,
    mr_iid: int | None,
    template: str | None,
    job_stats: str | None,
) -> int:
    """Render the report and keep this report id's note on the merge request up to date."""
    from ci_fxcache.report import render
    from ci_fxcache.report.gitlab_api import JOB_TOKEN_ENV, GitLabClient, GitLabError

    env = dict(os.environ)
    own = (env.get("CI_SERVER_URL", ""), env.get("CI_PROJECT_PATH", ""))
    limit = render.COMMENT_LIMIT - 200  # room for the marker line
    body, doc_report_id = pr_comment.render_body(results, template, limit, own, job_stats)
    report_id = report_id or names.check_report_id(doc_report_id)
    mr = merge_request_from_env(env, mr_iid)
    if mr is None:
        return _skip("not a merge request pipeline (no CI_MERGE_REQUEST_IID / CI_API_V4_URL)")
    token = env.get(token_env, "")
    if not token:
        return _skip(
            f"${token_env} is empty (a project access token with api scope, in a masked "
            "variable; a fork's pipeline does not get the parent project's variables)"
        )
    try:
        client = GitLabClient(token, mr.api_url, job_token=token_env == JOB_TOKEN_ENV)
        user = client.request("GET", "/user").json()
        action, nid = upsert_note(client, mr, body, report_id, int(user["id"]))
    except (GitLabError, ValueError, KeyError, TypeError) as exc:
        return _skip(str(exc) or type(exc).__name__)
    print(f"fxcache: {action} note {nid} on merge request !{mr.iid} of project {mr.project_id}")
    return 0
