"""The local store and the remote tier composed: save locally, then publish.

The one module that imports both the local save (store.save) and the remote tier
(store.remote); neither imports the other's save path. `save` is the one save of the toolkit:
`fxcache save` and the action's saves (the save sub-action, the end-of-job save) call it.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ci_fxcache import gha
from ci_fxcache.store import manifest as mf
from ci_fxcache.store import save as store_save
from ci_fxcache.store.layout import Layout
from ci_fxcache.store.remote.factory import StoreChoice, check_settings, tier_for
from ci_fxcache.store.remote.tier import RemoteTier, RemoteUnavailable
from ci_fxcache.store.remote.transfer import publish_scope
from ci_fxcache.store.state_file import RestoreState


@dataclass(frozen=True)
class Saved:
    """What a save did: its summary (JSON: `saved`, and `reason` or the scope's `files`,
    `added`, `bytes`, `signed`, with the remote tier's `remote` result when it published or
    said why not) and the manifest it committed under the scope's lock (None: none)."""

    summary: dict[str, Any]
    committed: mf.Committed | None = None

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
    tier, unusable = _tier(state, choice)
    layout = Layout(root if root is not None else state.root)
    result, committed = store_save.save_state(layout, state, signing_key)
    outcome = Saved(result, committed)
    if not outcome.saved or committed is None:
        return outcome
    if unusable is not None:
        if outcome.added:
            kind = state.remote_use.store if state.remote_use else "remote"
            gha.warn(f"store {kind}: this run added to the cache, but nothing was uploaded: "
                     f"{unusable}")  # fmt: skip
        return outcome
    if tier is None:
        return outcome
    if not (tier.publishes_every_save or outcome.added):
        remote = {"store": tier.name, "url": tier.describe(), "published": False,
                  "reason": "this run added nothing to the cache"}  # fmt: skip
        return Saved({**result, "remote": remote}, committed)
    _fault_stop()
    remote = publish_scope(layout, state.scope_key, tier, committed, signing_key)
    return Saved({**result, "remote": remote}, committed)


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
    if use.store not in ("s3", "github"):
        gha.warn(f"the restore state names store {use.store!r}; kept locally")
        return None
    return StoreChoice(kind=use.store, url=use.url, key_suffix=use.key_suffix)


def _tier(state: RestoreState, choice: StoreChoice | None) -> tuple[RemoteTier | None, str | None]:
    """The tier to publish to (None: none), or why it cannot be reached from this step."""
    chosen = _choice_of(state, choice)
    if chosen is None:
        return None, None
    check_settings(chosen)
    try:
        return tier_for(chosen, state.scope_key), None
    except RemoteUnavailable as exc:  # no Actions cache service in this step
        return None, str(exc)
    except Exception as exc:  # a state file edited by hand: not a reason to fail the job
        gha.warn(f"remote tier of the restore unusable ({exc}); kept locally")
        return None, None


def _fault_stop() -> None:
    """Test-only (store.save.FAULT_ENV `stop-before-publish`): the process stops itself
    between the local commit and the publish, so a test can swap the scope's files then and
    continue it (SIGCONT)."""
    if os.environ.get(store_save.FAULT_ENV) == "stop-before-publish":
        print("fxcache: test fault: committed, stopped before the publish", flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)
