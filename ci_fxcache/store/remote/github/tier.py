"""`store: github` as a backend of the remote tier (store.remote.tier): a thin adapter over
the Actions cache client (store.remote.github.cache_service), which keeps the protocol.

An entry is one archive of the whole scope directory (manifest included) under an immutable
key made from the scope key each call passes: fetch downloads the newest entry of the scope
by key prefix, publish uploads the committed scope as this run's entry. GitHub records each
entry's last access itself, so `touch` sends nothing.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ci_fxcache.store.layout import Layout
from ci_fxcache.store.manifest import Committed
from ci_fxcache.store.remote.github import cache_service
from ci_fxcache.store.remote.tier import Fetched, Published, RemoteCorrupt, RemoteUnavailable


def entry_prefix(scope_key: str, key_suffix: str) -> str:
    """The key prefix of scope `scope_key`'s entries (the one a restore looks up): the scope,
    then the key suffix. Entries are immutable: each run saves under the prefix plus
    `run<id>.<attempt>` (entry_key)."""
    return f"{scope_key}-{key_suffix + '-' if key_suffix else ''}"


def entry_key(scope_key: str, key_suffix: str, env: Mapping[str, str] | None = None) -> str:
    """This run's entry key for the scope: the prefix, then $GITHUB_RUN_ID and
    $GITHUB_RUN_ATTEMPT (a re-run attempt saves its own entry)."""
    env = os.environ if env is None else env
    run = env.get("GITHUB_RUN_ID", "0"), env.get("GITHUB_RUN_ATTEMPT", "1")
    return cache_service.entry_key(entry_prefix(scope_key, key_suffix), *run)


class GitHubTier:
    """The Actions cache as tier 2. Like every tier it takes the scope key on each call: a
    save uploads entry `entry_key(key, key_suffix)`, a restore takes the newest entry under
    `entry_prefix(key, key_suffix)`. The cache service is looked up at the first request:
    RemoteUnavailable there when this step has none (a step that is not a JavaScript
    action's), which the transfer turns into one warning and local-only operation."""

    name = "github"
    read_only = False
    publishes_every_save = False  # each publish is a new immutable entry

    def __init__(
        self, key_suffix: str = "", service: cache_service.CacheService | None = None
    ) -> None:
        self.key_suffix = key_suffix
        self._service = service

    def _client(self) -> cache_service.CacheService:
        if self._service is None:
            where, problem = cache_service.runtime()
            if where is None:
                raise RemoteUnavailable(str(problem))
            self._service = cache_service.CacheService(where)
        return self._service

    def describe(self) -> str:
        """For messages."""
        return "the GitHub cache"

    def fetch(
        self, layout: Layout, key: str, target: Path, signing_key: str | None
    ) -> Fetched | None:
        """Download the newest entry of scope `key` into `target`, every file checked against
        the archive's manifest as it is written (the local restore that follows checks the
        manifest itself: its signature with a signing key)."""
        try:
            restored = cache_service.restore_directory(
                self._client(), target, entry_key(key, self.key_suffix),
                [entry_prefix(key, self.key_suffix)],
            )  # fmt: skip
        except cache_service.ArchiveUnusable as exc:
            raise RemoteCorrupt(str(exc)) from None
        except cache_service.CacheServiceError as exc:
            raise RemoteUnavailable(str(exc)) from None
        if restored is None:
            return None
        done = restored.unpacked
        detail = {"matched_key": restored.matched}
        return Fetched(done.files, done.total_bytes, detail, done.written)

    def publish(
        self, layout: Layout, key: str, committed: Committed, signing_key: str | None
    ) -> Published:
        """Upload committed scope `key` (`committed`, its save's manifest) as this run's entry
        (its key is the result's `key`)."""
        try:
            sent = cache_service.save_directory(
                self._client(), layout.scope(key), entry_key(key, self.key_suffix), committed
            )
        except cache_service.CacheServiceError as exc:
            raise RemoteUnavailable(str(exc)) from None
        return Published(bool(sent.pop("uploaded")), counts=sent)

    def touch(self, key: str) -> None:
        """Nothing to send: the service records each entry's last access."""

    def stats(self) -> dict[str, Any]:
        """Not counted for this backend."""
        return {}
