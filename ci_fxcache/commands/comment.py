"""`fxcache comment`: keep one sticky pull-request comment with the report up to date."""

from __future__ import annotations

import argparse
from typing import Any

from ci_fxcache.commands import options
from ci_fxcache.report import pr_comment


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
        default="GITHUB_TOKEN",
        metavar="NAME",
        help="environment variable that holds the token (default GITHUB_TOKEN)",
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
    # The command is pr_comment.run itself (already imported with the action's steps).
    parser.set_defaults(func=pr_comment.run)


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
