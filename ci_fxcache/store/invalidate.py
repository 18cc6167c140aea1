"""`fxcache invalidate`: the one call shape every store implements, and the local store's.

Each store (the local root, S3, GitHub's Actions caches, Redis) is an `Invalidator` whose
`invalidate(policy, dry_run)` returns an `InvalidationResult`; the command gets it from the
factory (store/remote/factory.py `invalidator_for`) and never branches on the store. A store
that cannot be reached raises `CheckFailed` (exit 1: the scheduled job's input was fine);
bad input (a missing policy the store needs, no permission to delete) is a `UsageError`.

The local store's root holds two trust namespaces (docs/security.md): the root's own scopes
and those of runs that read a remote tier they may not write (`<root>/.remote-readers/`).
Both are cleaned, each by the policies on its own (its own `--keep-latest` per runner pool,
its own `--max-size`), so scopes that unreviewed runs committed never push a trusted run's
scopes out.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ci_fxcache.env import scopekey
from ci_fxcache.store import modes, scopes, seal
from ci_fxcache.store.layout import LOCKS, REMOTE_READERS, SEALS, Layout, trust_root
from ci_fxcache.store.policies import Entry, Policy, select


@dataclass(frozen=True)
class InvalidationResult:
    """What one store's invalidation did (or would): one row per selected cache (`store`,
    `scope`, `bytes`, `last_used`, `reasons`, `action`; `failed: why` where a removal
    failed), the store's own figures (merged into the top level of `invalidate --json`), and
    whether a collection stopped short (exit 1, like a failed removal)."""

    rows: list[dict[str, Any]]
    extra: dict[str, Any] = field(default_factory=dict)
    stopped: bool = False

    @property
    def failed(self) -> bool:
        """Whether anything selected was left in place by an error (exit 1)."""
        return self.stopped or any(str(r["action"]).startswith("failed") for r in self.rows)


class Invalidator(Protocol):
    """One store, as `fxcache invalidate` sees it."""

    def invalidate(self, policy: Policy, dry_run: bool) -> InvalidationResult:
        """Apply `policy`: remove (unless `dry_run`) what it selects. CheckFailed when the
        store cannot be reached, UsageError for a policy it cannot apply."""
        ...


class LocalStore:
    """The local store's root and its read-only runs' namespace."""

    def __init__(self, root: Path) -> None:
        self.layout = Layout(root)

    def namespaces(self) -> list[tuple[str, Layout]]:
        """(row prefix, layout) of each namespace in the root that exists."""
        found = [("", self.layout)]
        readers = trust_root(self.layout.root, may_write_remote=False)
        if readers != self.layout.root and readers.is_dir():
            found.append((f"{REMOTE_READERS}/", Layout(readers)))
        return found

    def invalidate(self, policy: Policy, dry_run: bool) -> InvalidationResult:
        """`run` on each namespace (its rows' scopes prefixed with the namespace), then,
        unless a dry run, the prunes of what killed jobs left behind."""
        scopes.check_env()
        rows: list[dict[str, Any]] = []
        extra: dict[str, Any] = {"root": str(self.layout.root)}
        pruned = {"overlays_removed": 0, "temp_files_removed": 0, "seals_removed": 0}
        for prefix, layout in self.namespaces():
            for row in run(layout, policy, dry_run):
                rows.append({**row, "scope": prefix + row["scope"]})
            if not dry_run:
                pruned["overlays_removed"] += prune_overlays(layout, scopes.lease_ttl())
                pruned["temp_files_removed"] += prune_temp_files(layout)
                pruned["seals_removed"] += seal.prune_orphans(layout)
        return InvalidationResult(rows, {**extra, **({} if dry_run else pruned)})


def entries(layout: Layout) -> list[Entry]:
    """One entry per scope in the root, and one per quarantined scope or set-aside files
    (named `<key>.<stamp>.<pid>...` in `.quarantine/`), with its last use and size."""
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
    if layout.quarantine.is_dir():
        for path in sorted(layout.quarantine.iterdir()):
            parsed = scopekey.parse(path.name.rsplit(".", 2)[0])
            if parsed is None or not path.is_dir() or path.is_symlink():
                continue
            found.append(
                Entry(
                    name=path.name,
                    key=parsed,
                    last_used=path.lstat().st_mtime,
                    size=scopes.tree_bytes(path),
                    quarantined=True,
                )
            )
    return found


def _remove(layout: Layout, entry: Entry) -> str:
    """Remove one selected entry; the action taken, as the row says it."""
    if entry.quarantined:
        path = layout.quarantine / entry.name
        scopes.remove_tree(path)
        Path(f"{path}.json").unlink(missing_ok=True)
        return "removed"
    with scopes.lock(layout, entry.name):
        if scopes.live_leases(layout, entry.name):
            return "kept (a job is writing it)"
        if layout.scope(entry.name).exists():
            scopes.remove(layout, entry.name)
    return "removed"


def run(
    layout: Layout, policy: Policy, dry_run: bool, now: float | None = None
) -> list[dict[str, Any]]:
    """Select and (unless dry_run) remove scopes and quarantined entries; scopes a job is still
    writing are kept; a removal that fails says `failed: why`."""
    modes.restrict_umask()
    now = time.time() if now is None else now
    rows = []
    for entry in select(entries(layout), policy, now):
        action = "would remove" if dry_run else "removed"
        if not dry_run:
            try:
                action = _remove(layout, entry)
            except (OSError, TimeoutError) as exc:
                action = f"failed: {exc}"
        rows.append(
            {
                "store": "local",
                "scope": entry.name,
                "quarantined": entry.quarantined,
                "bytes": entry.size,
                "last_used": entry.last_used,
                "reasons": entry.reasons,
                "action": action,
            }
        )
    return rows


def prune_overlays(layout: Layout, max_age_s: float, now: float | None = None) -> int:
    """Remove orphaned overlays; how many. An overlay whose lease is dead (its job ended) goes
    at once; one named by no lease (a read-only job's, which may still run; a restore killed
    while building it; an interrupted spare build) once older than `max_age_s`. Checked under
    the scope's lock, so no overlay being built or taken is touched."""
    now = time.time() if now is None else now
    if not layout.overlays.is_dir():
        return 0
    count = 0
    for path in sorted(layout.overlays.iterdir()):
        key = path.name.rsplit(".", 1)[0]
        try:
            if scopekey.parse(key) is None:  # `.spare-build-*`, anything else: by age
                orphaned = now - path.lstat().st_mtime > max_age_s
            else:
                with scopes.lock(layout, key):
                    alive, named = scopes.leased_overlays(layout, key)
                    orphaned = str(path) not in alive and (
                        str(path) in named or now - path.lstat().st_mtime > max_age_s
                    )
            if orphaned:
                scopes.remove_tree(path)
                count += 1
        except (OSError, TimeoutError):
            continue
    return count


def prune_temp_files(layout: Layout) -> int:
    """Remove the temporary manifests and seals of saves and restores killed before their
    rename (`.locks/<key>.manifest.json.*.tmp`, `.seals/.seals.<key>.json.*.tmp`), each under
    its scope's lock (a save still writing one holds it); how many."""
    count = 0
    found = [*layout.root.joinpath(LOCKS).glob("*.manifest.json.*.tmp")]
    found += layout.seals.glob(f"{SEALS}.*.json.*.tmp")
    for path in found:
        key = path.name.removeprefix(f"{SEALS}.").split(".manifest.json.")[0]
        key = key.split(".json.")[0]
        if scopekey.parse(key) is None:
            continue
        try:
            with scopes.lock(layout, key):
                path.unlink(missing_ok=True)
                count += 1
        except (OSError, TimeoutError):
            continue
    return count
