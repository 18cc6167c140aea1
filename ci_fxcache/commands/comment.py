"""`fxcache comment`: keep one sticky pull-request comment (or, with --gitlab, one GitLab
merge-request note) with the report up to date."""

from __future__ import annotations

import argparse
from typing import Any

from ci_fxcache.commands import options
from ci_fxcache.errors import UsageError
from ci_fxcache.report import mr_note, pr_comment


def register(sub: Any, parent: argparse.ArgumentParser) -> None:
    """Add the `comment` subcommand."""
    parser = sub.add_parser(
        "comment",
        parents=[parent],
        help="create or update the sticky pull-request comment with the report",
        description="Render RESULTS (a results JSON of either schema, or a markdown file from "
        "'fxcache report') and create or update this report id's comment on the pull request "
        "of the current event. Needs 'permissions: pull-requests: write'.",
    )
    parser.add_argument("results", metavar="RESULTS", help="results JSON (or rendered .md)")
    options.report_id_option(
        parser,
        default=None,
        help="which sticky comment to keep (default: the document's report_id); one comment "
        "per id, so several workflows can each keep their own",
    )
    parser.add_argument(
        "--token-env",
        default=None,
        metavar="NAME",
        help="environment variable that holds the token (default GITHUB_TOKEN; with --gitlab "
        f"{mr_note.TOKEN_ENV}, a project access token with api scope)",
    )
    parser.add_argument(
        "--gitlab",
        action="store_true",
        help="post a GitLab merge-request note instead, to the merge request of this pipeline "
        "(CI_API_V4_URL, CI_MERGE_REQUEST_PROJECT_ID, CI_MERGE_REQUEST_IID; --pr overrides the "
        "iid); no merge request, no token or an API error is one line, never a failure",
    )
    parser.add_argument(
        "--pr",
        type=int,
        default=None,
        metavar="N",
        help="pull request number (default: from $GITHUB_EVENT_PATH); the workflow_run "
        "follow-up for forks passes it from the artifact",
    )
    _source_options(parser)
    parser.set_defaults(func=comment)


def comment(
    *,
    results: str,
    report_id: str | None,
    token_env: str | None,
    pr: int | None,
    repo: str | None,
    author: str | None,
    from_artifact: str | None,
    template: str | None,
    job_stats: str | None,
    gitlab: bool,
) -> int:
    """The GitHub pull-request comment (pr_comment.post, its token read from $`token_env`),
    or with `gitlab` the merge-request note (mr_note.post), which takes no GitHub-only option."""
    if not gitlab:
        return pr_comment.post(
            results=results, report_id=report_id, token_env=token_env or "GITHUB_TOKEN", pr=pr,
            repo=repo, author=author, from_artifact=from_artifact, template=template,
            job_stats=job_stats, token=None,
        )  # fmt: skip
    given = [f"--{n}" for n, v in (("repo", repo), ("author", author),
                                    ("from-artifact", from_artifact)) if v]  # fmt: skip
    if given:
        raise UsageError(f"{', '.join(given)}: GitHub only, not with --gitlab")
    return mr_note.post(
        results=results, report_id=report_id, token_env=token_env or mr_note.TOKEN_ENV,
        mr_iid=pr, template=template, job_stats=job_stats,
    )  # fmt: skip


def _source_options(parser: argparse.ArgumentParser) -> None:
    """Where the comment goes and what it is made from, beyond the results."""
    parser.add_argument(
        "--repo",
        default=None,
        metavar="OWNER/NAME",
        help="repository (default $GITHUB_REPOSITORY)",
    )
    parser.add_argument(
        "--author",
        default=None,
        metavar="LOGIN",
        help="the login whose comments are ours (default: the token's own login from GraphQL "
        "viewer: github-actions[bot] for GITHUB_TOKEN, <slug>[bot] for a GitHub App's token, "
        "the user for a personal token); comments by anyone else are never edited or deleted",
    )
    parser.add_argument(
        "--from-artifact",
        default=None,
        metavar="NAME",
        help="RESULTS comes from the artifact NAME (fxcache-report-<id>) of another run (the "
        "fork follow-up): refused when the artifact is over 20 MiB or the document's report "
        "id is not <id> (default: none, RESULTS is a local file)",
    )
    parser.add_argument(
        "--job-stats",
        default=None,
        metavar="FILE",
        help="the job's own figures (fxcache stats --json): their line goes under the status, "
        "their detail collapsed (default: none)",
    )
    parser.add_argument(
        "--template",
        metavar="T",
        help="jinja2 template for the markdown (default: the built-in one)",
    )
