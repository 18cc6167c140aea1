"""`fxcache invalidate`: remove stale caches by policy (the local store, S3, GitHub's caches,
Redis), each store built by the factory and cleaned through one call shape
(store/invalidate.py)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ci_fxcache import userfiles
from ci_fxcache.commands import options
from ci_fxcache.env import fingerprint
from ci_fxcache.errors import EXIT_CHECK_FAILED, UsageError
from ci_fxcache.report import invalidation, text_table
from ci_fxcache.report.invalidation import human_bytes
from ci_fxcache.store import trust
from ci_fxcache.store.layout import resolve_root
from ci_fxcache.store.policies import Policy, parse_duration, parse_size, parse_torch_version
from ci_fxcache.store.remote.factory import StoreChoice, invalidator_for


def register(sub: Any, parent: argparse.ArgumentParser) -> None:
    """Add the `invalidate` subcommand."""
    parser = sub.add_parser(
        "invalidate",
        parents=[parent],
        help="remove stale caches by policy (local store, --github caches, --redis keys, "
        "--s3 tier)",
        description="Policies combine: a cache goes when any policy selects it; --max-size then "
        "evicts the least recently used until the rest fits. --dry-run lists what would go.",
    )
    options.root_option(parser)
    options.python_option(parser)
    parser.add_argument(
        "--max-age", metavar="AGE", help="unused for longer than AGE (14d, 12h; default: none)"
    )
    parser.add_argument(
        "--max-size", metavar="SIZE", help="evict LRU until the total fits (50G; default: none)"
    )
    parser.add_argument(
        "--keep-latest", metavar="N", type=int, help="keep N per runner pool (default: none)"
    )
    parser.add_argument(
        "--older-torch-than",
        metavar="VERSION",
        help="torch older than VERSION, or 'current' (the torch of --python; default: none)",
    )
    parser.add_argument("--dry-run", action="store_true", help="list what would go and why")
    parser.add_argument(
        "--json", dest="as_json", action="store_true", help="print the result as JSON"
    )
    parser.add_argument(
        "--github", action="store_true", help="GitHub Actions caches instead of the local store"
    )
    parser.add_argument("--redis", action="store_true", help="Redis keys (needs --max-age)")
    options.redis_url_option(parser, "Redis URL")
    parser.add_argument(
        "--s3", action="store_true", help="the S3 tier's scopes, then unreferenced objects"
    )
    options.s3_url_option(parser)
    parser.add_argument(
        "--object-url",
        default=None,
        metavar="URL",
        help="with --s3: the bucket of `--store object`, s3://, gs:// or az://BUCKET/PREFIX, "
        "or file:///PATH, "
        "in place of --s3-url (env FXCACHE_OBJECT_URL; default: none)",
    )
    parser.add_argument(
        "--gc-grace",
        metavar="AGE",
        default="1d",
        help="with --s3: keep unreferenced objects younger than AGE (a save in flight; default 1d)",
    )
    parser.set_defaults(func=run)


def policy(
    python: str,
    max_age: str | None,
    max_size: str | None,
    keep_latest: int | None,
    older_torch_than: str | None,
) -> Policy:
    """The policies from their flags (`older_torch_than` 'current': the torch of `python`)."""
    older = older_torch_than
    if older == "current":
        older = fingerprint.collect(python).torch_version
    elif older is not None:
        older = parse_torch_version(older)
    if keep_latest is not None and keep_latest < 0:
        raise UsageError("--keep-latest must be 0 or more")
    return Policy(
        max_age_s=parse_duration(max_age) if max_age else None,
        max_size=parse_size(max_size) if max_size else None,
        keep_latest=keep_latest,
        older_torch_than=older,
    )


def run(
    *,
    root: Path | None,
    python: str,
    max_age: str | None,
    max_size: str | None,
    keep_latest: int | None,
    older_torch_than: str | None,
    dry_run: bool,
    as_json: bool,
    github: bool,
    redis: bool,
    redis_url: str | None,
    s3: bool,
    s3_url: str | None,
    object_url: str | None,
    gc_grace: str,
) -> int:
    """Apply the policies to the chosen store(s); print a table or JSON. Exit 1 when a
    selected cache could not be removed or a store could not be reached."""
    bucket = "object" if object_url else "s3"  # the same tier; object: any scheme's service
    chosen = [kind for kind, on in (("redis", redis), ("github", github), (bucket, s3)) if on]
    result, code = invalidate(
        stores=chosen or ["local"],
        root=root,
        policy=policy(python, max_age, max_size, keep_latest, older_torch_than),
        dry_run=dry_run,
        urls={"redis": redis_url, "s3": s3_url, "object": object_url},
        gc_grace=gc_grace,
        signing_key=trust.signing_key(),
    )
    print(json.dumps(result, indent=2) if as_json else _table(result))
    return code


def invalidate(
    *,
    stores: Sequence[str],
    root: Path | None,
    policy: Policy,
    dry_run: bool,
    urls: Mapping[str, str | None] | None = None,
    gc_grace: str = "1d",
    github_token: str | None = None,
    signing_key: str | None = None,
) -> tuple[dict[str, Any], int]:
    """The typed call behind `fxcache invalidate` (the action's invalidate makes it too): each
    store of `stores` (local, redis, github, s3), built by the factory, cleaned by one call
    shape; the result as `--json` prints it, and the exit code (1: something selected was
    not removed). A store that cannot be reached raises CheckFailed (exit 1). With
    `signing_key`, the bucket's collection folds signed references into the head."""
    inventory = list(stores) in (["s3"], ["object"]) and dry_run
    if policy.empty and not inventory:
        raise UsageError(
            "give at least one policy: --max-age, --max-size, --keep-latest or --older-torch-than"
            " (--s3 --dry-run alone lists the bucket's scopes)"
        )
    local_root = userfiles.output_dir(resolve_root(root), "--root") if "local" in stores else None
    grace = parse_duration(gc_grace) if {"s3", "object"} & set(stores) else None
    result: dict[str, Any] = {"dry_run": dry_run, "rows": []}
    failed = False
    for kind in stores:
        choice = StoreChoice(kind=kind, url=(urls or {}).get(kind))
        store = invalidator_for(
            choice, root=local_root, gc_grace_s=grace, github_token=github_token,
            signing_key=signing_key,
        )  # fmt: skip
        done = store.invalidate(policy, dry_run)
        result["rows"] += done.rows
        result.update(done.extra)
        failed = failed or done.failed
    return result, EXIT_CHECK_FAILED if failed else 0


def _table(result: dict[str, Any]) -> str:
    lines = []
    rows = result["rows"]
    if rows:
        table = [["action", "store", "cache", "size", "last used", "why"]] + [
            [
                str(row["action"]),
                str(row["store"]),
                str(row["scope"]),
                human_bytes(row["bytes"]),
                invalidation.when(row["last_used"]),
                "; ".join(row["reasons"]),
            ]
            for row in rows
        ]
        lines.extend(text_table.lines(table, right={3}, rule=True))
        verb = "would free" if result["dry_run"] else "freed"
        lines.append(
            f"\n{len(rows)} cache(s), {verb} {human_bytes(invalidation.freed_bytes(result))}"
        )
        failed = sum(1 for r in rows if str(r["action"]).startswith("failed"))
        if failed:
            lines.append(f"{failed} removal(s) FAILED (see the action column)")
    elif "redis" not in result and not result.get("overlays_removed"):
        lines.append("nothing to remove")
    if "s3" in result:
        lines.extend(invalidation.s3_lines(result["s3"]))
    if result.get("overlays_removed") or result.get("temp_files_removed"):
        lines.append(
            f"pruned {result.get('overlays_removed', 0)} orphaned overlay(s), "
            f"{result.get('temp_files_removed', 0)} temporary file(s) of killed saves"
        )
    if "redis" in result:
        r = result["redis"]
        verb = "would remove" if r["dry_run"] else "removed"
        lines.append(
            f"Redis {r['url']}: scanned {r['scanned']} pt2: keys, {verb} "
            f"{r['would_remove']} idle ones ({human_bytes(r['bytes'])})"
        )
    return "\n".join(lines)
