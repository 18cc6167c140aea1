"""`fxcache invalidate` on the local store: apply the policies to every scope in the root."""

from __future__ import annotations

import time
from typing import Any

from ci_fxcache import scopekey
from ci_fxcache.store import scopes
from ci_fxcache.store.layout import Layout
from ci_fxcache.store.policies import Entry, Policy, select


def entries(layout: Layout) -> list[Entry]:
    """One entry per scope in the root, with its last use and size."""
    found = []
    for key in layout.scope_keys():
        parsed = scopekey.parse(key)
        assert parsed is not None
        found.append(
            Entry(
                name=key,
                key=parsed,
                last_used=scopes.last_used(layout, key),
                size=scopes.tree_bytes(layout.scope(key)),
            )
        )
    return found


def run(
    layout: Layout, policy: Policy, dry_run: bool, now: float | None = None
) -> list[dict[str, Any]]:
    """Select and (unless dry_run) remove scopes; scopes a job is still writing are kept."""
    now = time.time() if now is None else now
    rows = []
    for entry in select(entries(layout), policy, now):
        action = "would remove" if dry_run else "removed"
        if not dry_run:
            try:
                with scopes.lock(layout, entry.name):
                    if scopes.live_leases(layout, entry.name):
                        action = "kept (a job is writing it)"
                    elif layout.scope(entry.name).exists():
                        scopes.remove(layout, entry.name)
            except (OSError, TimeoutError) as exc:
                action = f"failed: {exc}"
        rows.append(
            {
                "store": "local",
                "scope": entry.name,
                "bytes": entry.size,
                "last_used": entry.last_used,
                "reasons": entry.reasons,
                "action": action,
            }
        )
    return rows


def prune_overlays(layout: Layout, max_age_s: float, now: float | None = None) -> int:
    """Remove private overlays of read-only restores older than `max_age_s`; how many."""
    now = time.time() if now is None else now
    if not layout.overlays.is_dir():
        return 0
    count = 0
    for path in layout.overlays.iterdir():
        try:
            if now - path.stat().st_mtime > max_age_s:
                scopes.remove_tree(path)
                count += 1
        except OSError:
            continue
    return count
