"""`fxcache invalidate`: remove stale caches by policy (local store, GitHub caches, Redis)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from ci_fxcache import userfiles
from ci_fxcache.commands import options
from ci_fxcache.env import fingerprint
from ci_fxcache.errors import EXIT_CHECK_FAILED, CheckFailed, UsageError
from ci_fxcache.report import invalidation, text_table
from ci_fxcache.store import invalidate as local
from ci_fxcache.store import seal, trust
from ci_fxcache.store.layout import Layout, resolve_root
from ci_fxcache.store.policies import Policy, parse_duration, parse_size, parse_torch_version
from ci_fxcache.store.remote import redis_cache
from ci_fxcache.store.scopes import check_env, human_bytes, lease_ttl


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
        "--gc-grace",
        metavar="AGE",
        default="1d",
        help="with --s3: keep unreferenced objects younger than AGE (a save in flight; default 1d)",
    )
    parser.set_defaults(func=run)


def _policy(
    python: str,
    max_age: str | None,
    max_size: str | None,
    keep_latest: int | None,
    older_torch_than: str | None,
) -> Policy:
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
    gc_grace: str,
) -> int:
    """Apply the policies to the chosen store(s); print a table or JSON. Exit 1 when a
    selected cache could not be removed."""
    check_env()
    policy = _policy(python, max_age, max_size, keep_latest, older_torch_than)
    inventory = s3 and dry_run and not (github or redis)
    if policy.empty and not inventory:
        raise UsageError(
            "give at least one policy: --max-age, --max-size, --keep-latest or --older-torch-than"
            " (--s3 --dry-run alone lists the bucket's scopes)"
        )
    result: dict[str, Any] = {"dry_run": dry_run, "rows": []}
    if redis:
        result["redis"] = _redis(policy, redis_url, dry_run)
    if github:
        from ci_fxcache.store.remote.github.invalidate import run as github_run

        result["rows"] += github_run(policy, dry_run)
    if s3:
        rows, result["s3"] = _s3(policy, s3_url, gc_grace, dry_run)
        result["rows"] += rows
    if not redis and not github and not s3:
        layout = Layout(userfiles.output_dir(resolve_root(root), "--root"))
        result["root"] = str(layout.root)
        result["rows"] += local.run(layout, policy, dry_run)
        if not dry_run:
            result["overlays_removed"] = local.prune_overlays(layout, lease_ttl())
            result["temp_files_removed"] = local.prune_temp_files(layout)
            result["seals_removed"] = seal.prune_orphans(layout)
    if as_json:
        print(json.dumps(result, indent=2))
    else:
        print(_table(result))
    failed = [r for r in result["rows"] if str(r["action"]).startswith("failed")]
    stopped = "error" in result.get("s3", {}).get("gc", {})
    return EXIT_CHECK_FAILED if failed or stopped else 0


def _redis(policy: Policy, redis_url: str | None, dry_run: bool) -> dict[str, Any]:
    """Redis keys idle longer than --max-age; CheckFailed (exit 1) when Redis fails."""
    if policy.max_age_s is None:
        raise UsageError("--redis needs --max-age (Redis keys are expired by idle time)")
    url = redis_cache.resolve_url(redis_url)
    try:
        return redis_cache.expire_idle(url, policy.max_age_s, dry_run)
    except Exception as exc:  # redis errors: the network or the server, not the user's input
        raise CheckFailed(f"Redis at {redis_cache.redact(url)}: {exc}") from exc


def _s3(
    policy: Policy, s3_url: str | None, gc_grace: str, dry_run: bool
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The bucket's scopes by policy, then its unreferenced objects: the rows and the
    result's `s3` object; CheckFailed (exit 1) when the bucket cannot be used."""
    from ci_fxcache.store.remote.factory import s3_tier
    from ci_fxcache.store.remote.s3 import invalidate as s3_invalidate
    from ci_fxcache.store.remote.tier import RemoteUnavailable

    grace = parse_duration(gc_grace)
    if grace < s3_invalidate.MIN_GRACE_S:
        raise UsageError(
            f"--gc-grace {gc_grace}: at least {s3_invalidate.MIN_GRACE_S / 3600:g}h (a save "
            "in flight uploads its packs before the head that names them)"
        )
    tier = s3_tier(s3_url)
    try:
        done = s3_invalidate.run(tier, policy, dry_run, grace, signing_key=trust.signing_key())
    except RemoteUnavailable as exc:  # the network, not the user's input: exit 1
        raise CheckFailed(f"S3 {tier.describe()}: {exc}") from exc
    return done["rows"], {"url": tier.describe(), "dry_run": dry_run, "gc": done["gc"],
                          "scopes": done["scopes"], "bucket": done["bucket"]}  # fmt: skip


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
