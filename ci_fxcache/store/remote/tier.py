"""The interface of a remote-tier backend, its errors, and where fetches happen locally."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ci_fxcache.store.layout import Layout
from ci_fxcache.store.manifest import Committed
from ci_fxcache.store.seal import Fresh

# Fetches in progress (fresh directories renamed into a scope when complete) and what
# backends keep about the remote tier on this runner (immutable index objects, bad objects).
REMOTE_DIR = ".remote"


class RemoteUnavailable(Exception):
    """The remote tier cannot be used now (unreachable, credentials, missing bucket,
    throttled): one warning, then local-only operation."""


class RemoteCorrupt(Exception):
    """The remote copy of a scope is broken (an object missing, a hash that does not match,
    an unsigned or wrongly signed manifest under a signing key)."""

    def __init__(self, reason: str, problems: list[str] | None = None) -> None:
        super().__init__(reason)
        self.problems = problems or []


@dataclass(frozen=True)
class Fetched:
    """What a fetch wrote: files, bytes, and transfer counts (requests by kind, bytes in);
    and, where the backend created every file and directory itself and checked every byte
    as it wrote it, what it vouches for (store.seal.Fresh): its seal is written when the
    fetch is renamed into place, so that the local restore that follows stats what the fetch
    made instead of listing every directory again, and a full verification that follows at
    once stats the files instead of hashing them again."""

    files: int
    total_bytes: int
    detail: dict[str, Any]
    written: Fresh | None = None


@dataclass(frozen=True)
class Published:
    """What a publish did: whether it made the remote copy hold the save's files (`published`),
    why not (`reason`), how (`via`: "head" or "reference" on a bucket), the copy it replaced
    and why (`replaced`: a remote copy this job could not extend), and the tier's own counts
    (files, packs, references, requests, bytes), shown as they are."""

    published: bool
    reason: str | None = None
    via: str | None = None
    replaced: str | None = None
    counts: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The save result's `remote` fields: `published`, `reason` when set, `via` and
        `replaced` (null: nothing replaced) for a publish that says how, then the counts."""
        out: dict[str, Any] = {"published": self.published}
        if self.reason is not None:
            out["reason"] = self.reason
        if self.via is not None:
            out.update(via=self.via, replaced=self.replaced)
        return {**out, **self.counts}


class RemoteTier(Protocol):
    """A backend of tier 2."""

    name: str
    read_only: bool  # True only for the ReadOnly wrapper
    # Whether a save that added nothing still publishes (S3: it completes what a killed save
    # left half-sent); False where each publish makes a new immutable entry (GitHub).
    publishes_every_save: bool

    def describe(self) -> str:
        """Where it is, for messages (never a credential)."""
        ...

    def fetch(
        self, layout: Layout, key: str, target: Path, signing_key: str | None
    ) -> Fetched | None:
        """Create `target` (which does not exist) holding scope `key`'s files and a local
        manifest; None when the remote has no such scope. Every file written is checked
        against the remote index first."""
        ...

    def publish(
        self, layout: Layout, key: str, committed: Committed, signing_key: str | None
    ) -> Published:
        """Upload what the remote copy of local scope `key` lacks of the files `committed` (the
        manifest its save checked and signed under the lock) lists, each file read from the
        scope and left out unless it still matches its entry."""
        ...

    def touch(self, key: str) -> None:
        """Mark scope `key` as used now, cheaply (invalidation's --max-age)."""
        ...

    def stats(self) -> dict[str, Any]:
        """Transfer counts so far (requests by kind, bytes each way), where the backend has them."""
        ...


class ReadOnly:
    """A backend this run reads and never writes (a pull request's run under `save: auto`):
    the one way read-only is done for every tier. Its publish sends nothing, its touch
    nothing (no last-used marker)."""

    read_only = True
    publishes_every_save = False

    def __init__(self, tier: RemoteTier) -> None:
        self.inner = tier
        self.name = tier.name

    def describe(self) -> str:
        """The wrapped backend's."""
        return self.inner.describe()

    def fetch(
        self, layout: Layout, key: str, target: Path, signing_key: str | None
    ) -> Fetched | None:
        """The wrapped backend's fetch."""
        return self.inner.fetch(layout, key, target, signing_key)

    def publish(
        self, layout: Layout, key: str, committed: Committed, signing_key: str | None
    ) -> Published:
        """Nothing sent."""
        return Published(False, "this run reads the remote tier only")

    def touch(self, key: str) -> None:
        """Nothing sent."""

    def stats(self) -> dict[str, Any]:
        """The wrapped backend's counts."""
        return self.inner.stats()
