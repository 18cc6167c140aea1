"""GitHub Actions caches of our key format: list every page, decide by policy, delete by id.

The whole listing is read before anything is deleted (deleting while paging shifts the pages
and skips entries), with one request per page of 100; deciding needs no request per entry.
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

from ci_fxcache.env import scopekey
from ci_fxcache.errors import CheckFailed, UsageError
from ci_fxcache.github_api import GitHubClient, GitHubError
from ci_fxcache.store.invalidate import InvalidationResult
from ci_fxcache.store.policies import Entry, Policy, select

KEY_PREFIX = "fxcache-v"


def _epoch(stamp: str | None) -> float:
    if not stamp:
        return 0.0
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def list_entries(client: GitHubClient) -> tuple[list[Entry], dict[str, dict[str, Any]], int]:
    """Our caches as policy entries, the raw caches by id, and how many foreign ones were seen."""
    entries: list[Entry] = []
    raw: dict[str, dict[str, Any]] = {}
    foreign = 0
    params = {"key": KEY_PREFIX, "sort": "last_accessed_at", "direction": "desc"}
    for cache in client.paginate(client.repo_path("actions/caches"), params, "actions_caches"):
        parsed = scopekey.parse(str(cache.get("key", "")))
        if parsed is None:
            foreign += 1
            continue
        ident = str(cache["id"])
        raw[ident] = cache
        entries.append(
            Entry(
                name=cache["key"],
                key=parsed,
                last_used=_epoch(cache.get("last_accessed_at") or cache.get("created_at")),
                size=int(cache.get("size_in_bytes") or 0),
                ident=ident,
            )
        )
    return entries, raw, foreign


def run(
    policy: Policy, dry_run: bool, client: GitHubClient | None = None, now: float | None = None
) -> list[dict[str, Any]]:
    """Apply the policies to the repository's caches; return one row per selected cache."""
    client = client or GitHubClient.from_env()
    entries, raw, _foreign = list_entries(client)
    rows = []
    for entry in select(entries, policy, time.time() if now is None else now):
        action = "would remove" if dry_run else "removed"
        if not dry_run:
            try:
                client.request("DELETE", client.repo_path(f"actions/caches/{entry.ident}"))
            except GitHubError as exc:
                if exc.status == 404:
                    action = "already gone"
                elif exc.status == 403:
                    raise UsageError(
                        "deleting Actions caches needs 'permissions: actions: write' for the "
                        f"job's token (GitHub answered 403: {exc.api_message})"
                    ) from exc
                else:
                    raise
        rows.append(
            {
                "store": "github",
                "scope": entry.name,
                "id": int(entry.ident),
                "ref": raw[entry.ident].get("ref"),
                "bytes": entry.size,
                "last_used": entry.last_used,
                "reasons": entry.reasons,
                "action": action,
            }
        )
    return rows


class ActionsCaches:
    """`fxcache invalidate --github`: the repository's Actions caches of our key format (the
    store invalidation shape: store/invalidate.py). `token`: the job's token, passed in
    (None: $GITHUB_TOKEN)."""

    def __init__(self, token: str | None = None) -> None:
        self.token = token

    def invalidate(self, policy: Policy, dry_run: bool) -> InvalidationResult:
        """`run` with a client of the Actions environment; CheckFailed (exit 1) when the API
        gives no answer or fails for good (a 403 on delete stays a UsageError: permissions)."""
        client = GitHubClient.from_env(token=self.token)
        try:
            return InvalidationResult(run(policy, dry_run, client))
        except GitHubError as exc:
            raise CheckFailed(str(exc)) from exc
