"""The local store and the remote tier composed: fetch, then restore locally; save locally,
then publish.

The one module that imports both the local store (store.restore, store.save) and the remote
tier (store.remote); neither imports the other. `restore` and `save` are the toolkit's one
restore and one save: `fxcache restore` / `fxcache save` and the action's steps call them.
Code outside store/ reaches the store through this module and the factory (tests/test_layers.py).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ci_fxcache import gha
from ci_fxcache.store import manifest as mf
from ci_fxcache.store import restore as store_restore
from ci_fxcache.store import save as store_save
from ci_fxcache.store import scopes
from ci_fxcache.store.layout import Layout
from ci_fxcache.store.remote.factory import StoreChoice, check_settings, tier_for
from ci_fxcache.store.remote.tier import RemoteTier
from ci_fxcache.store.remote.transfer import publish_scope
from ci_fxcache.store.state_file import Restored, RestoreState

if TYPE_CHECKING:
    from ci_fxcache.env.fingerprint import Fingerprint

# The local restore's options and its verification depth, for the callers of `restore`.
RestoreOptions = store_restore.Options
full_verification = store_restore.full_verification
# The store's settings in the environment (lock and lease times): checked before a restore.
check_env = scopes.check_env


@contextmanager
def scope_lock(root: Path, key: str) -> Iterator[None]:
    """The lock of scope `key` in the local store at `root`, for what is kept beside the
    scope under it (the job history): jobs sharing a runner take turns."""
    with scopes.lock(Layout(root), key):
        yield


@dataclass(frozen=True)
class Saved:
    """What a save did: its summary (JSON: `saved`, and `reason` or the scope's `files`,
    `added`, `bytes`, `signed`, with the remote tier's `remote` result when it published or
    said why not) and the manifest it committed under the scope's lock (None: none)."""

    summary: dict[str, Any]
    committed: mf.Committed | None = None
    added_files: tuple[str, ...] = ()  # the files this save added to the committed manifest

    @property
    def saved(self) -> bool:
        return bool(self.summary.get("saved"))

    @property
    def reason(self) -> str | None:
        return self.summary.get("reason")

    @property
    def added(self) -> int:
        return int(self.summary.get("added") or 0)

    @property
    def remote(self) -> dict[str, Any] | None:
        remote = self.summary.get("remote")
        return remote if isinstance(remote, dict) else None


def not_saved(reason: str) -> Saved:
    """A save that did not happen, and why."""
    return Saved({"saved": False, "reason": reason})


def save(
    state: RestoreState,
    *,
    root: Path | None,
    choice: StoreChoice | None,
    signing_key: str | None,
) -> Saved:
    """Commit what restore's `state` handed out (into `root`, default the state's), then
    publish to the remote tier what it lacks of the manifest this save committed under the
    scope's lock (never a re-read of the disk): also after a save that added nothing, for a
    tier that publishes every save (a save killed during its upload is completed by the next).

    The tier is `choice`'s (the action's setup decided it), else the one the restore used; it
    is made first, so that a malformed setting is a usage error before anything is committed.
    A run that may only read the remote tier publishes nothing."""
    tier = _tier(state, choice)
    layout = Layout(root if root is not None else state.root)
    result, committed, added = store_save.save_state(layout, state, signing_key)
    outcome = Saved(result, committed, added)
    if not outcome.saved or committed is None or tier is None:
        return outcome
    if not (tier.publishes_every_save or outcome.added):
        remote = {"store": tier.name, "url": tier.describe(), "published": False,
                  "reason": "this run added nothing to the cache"}  # fmt: skip
        return Saved({**result, "remote": remote}, committed, added)
    _fault_stop()
    remote = publish_scope(layout, state.scope_key, tier, committed, signing_key)
    return Saved({**result, "remote": remote}, committed, added)


def _choice_of(state: RestoreState, choice: StoreChoice | None) -> StoreChoice | None:
    """The remote tier to publish to: `choice` when the restore used that store, else the
    restore's own (`fxcache save`: no setup decided one); None when there is none to write
    (a read-only restore, a run that reads the remote only) or the state names another store
    than setup chose (one warning: not a reason to fail the job)."""
    use = state.remote_use
    if use is None or state.read_only or use.read_only:
        return None
    if choice is not None and use.store != choice.kind:
        gha.warn(f"the restore state names store {use.store!r}, setup chose {choice.kind!r}")
        return None
    if choice is not None:
        return choice if choice.may_write_remote else None
    if use.store not in ("s3", "github", "object"):
        gha.warn(f"the restore state names store {use.store!r}; kept locally")
        return None
    return StoreChoice(kind=use.store, url=use.url, key_suffix=use.key_suffix)


def _tier(state: RestoreState, choice: StoreChoice | None) -> RemoteTier | None:
    """The tier to publish to (None: none)."""
    chosen = _choice_of(state, choice)
    if chosen is None:
        return None
    check_settings(chosen)
    try:
        return tier_for(chosen)
    except Exception as exc:  # a state file edited by hand: not a reason to fail the job
        gha.warn(f"remote tier of the restore unusable ({exc}); kept locally")
        return None


def _fault_stop() -> None:
    """Test-only (store.save.FAULT_ENV `stop-before-publish`): the process stops itself
    between the local commit and the publish, so a test can swap the scope's files then and
    continue it (SIGCONT)."""
    if os.environ.get(store_save.FAULT_ENV) == "stop-before-publish":
        print("fxcache: test fault: committed, stopped before the publish", flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)


def _cold_fallback(key: str, root: Path, error: str, fp: Fingerprint) -> Restored:
    import tempfile  # here, not at the top: restore starts on every job's critical path

    # Under $RUNNER_TEMP inside Actions: the runner empties it after every job.
    base = Path(tempfile.mkdtemp(prefix="fxcache-cold-", dir=os.environ.get("RUNNER_TEMP")))
    gha.warn(f"local store unusable ({error}); continuing cold in {base}")
    return Restored.cold(key, root, base, error, fp.to_dict())


def restore(
    layout: Layout,
    key: str,
    fp: Fingerprint,
    options: RestoreOptions,
    choice: StoreChoice,
    tier: RemoteTier | None,
) -> tuple[Restored, dict[str, Any] | None]:
    """Tier 2 first (a scope it has becomes a local one), then the local restore; a local
    store that cannot be used is a cold fallback. What was restored, its cache dirs made,
    and the remote tier's report (complete: with whether this run only reads the tier)."""
    from ci_fxcache.store.remote.transfer import fetch_scope

    remote_info = written = None
    try:
        if tier is not None:
            remote_info, written = fetch_scope(layout, key, tier, signing_key=options.signing_key)
        restored = store_restore.restore(layout, key, fp, options, written)
    except PermissionError as exc:
        # Not tampering: another user's files in a shared store. Nothing is quarantined.
        why = f"permission denied: {exc.filename or exc}; the scope is left as it is"
        restored = _cold_fallback(key, layout.root, why, fp)
    except (OSError, TimeoutError) as exc:
        restored = _cold_fallback(key, layout.root, str(exc), fp)
    for path in (restored.inductor_dir, restored.triton_dir, restored.verify_dir):
        path.mkdir(parents=True, exist_ok=True)
    if remote_info is None:
        return restored, None
    extra: dict[str, Any] = {"read_only": not choice.may_write_remote}
    if choice.key_suffix:
        extra["key_suffix"] = choice.key_suffix
    return restored, {**remote_info, **extra}
