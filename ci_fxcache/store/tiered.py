"""The local store and the remote tier composed: save locally, then publish.

The one module that imports both the local save (store.save) and the remote tier
(store.remote); neither imports the other's save path.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

from ci_fxcache import gha
from ci_fxcache.store import manifest as mf
from ci_fxcache.store import save as store_save
from ci_fxcache.store import state_file
from ci_fxcache.store.layout import Layout
from ci_fxcache.store.remote.factory import StoreChoice, check_settings, tier_for
from ci_fxcache.store.remote.tier import RemoteTier
from ci_fxcache.store.remote.transfer import publish_scope


def save_and_publish(path: Path, root: Path | None, signing_key: str | None) -> dict[str, Any]:
    """`save_from_state`, then, for a restore that used a remote tier and may write, the
    publication of what the remote copy lacks (also after a save that added nothing: a save
    killed during its upload is completed by the next one). The tier is made first: a
    malformed setting is a usage error before anything is committed."""
    state = state_file.read_state(path, root, signing_key)
    tier = remote_tier(state)
    result, committed = store_save.save_from_state(path, root, signing_key)
    layout = Layout(root if root is not None else Path(state["root"]))
    return publish_from_state(layout, state, result, committed, signing_key, tier)


def remote_tier(state: dict[str, Any], store: str | None = None) -> RemoteTier | None:
    """The remote tier restore's `state` used, when the job may write it (None otherwise).
    UsageError for malformed settings in the environment (FXCACHE_S3_TIMEOUT=abc); a state
    whose tier is unusable (edited by hand), or that names another store than `store` (the
    action's setup decided it), is one warning and no tier: not a reason to fail the job."""
    remote = state.get("remote")
    if not isinstance(remote, dict) or state.get("read_only"):
        return None
    if remote.get("read_only"):  # restore --remote-read-only: this run reads the tier only
        return None
    if store is not None and remote.get("store") != store:
        gha.warn(f"the restore state names store {remote.get('store')!r}, setup chose {store!r}")
        return None
    if remote.get("store") not in ("s3", "github"):
        gha.warn(f"the restore state names store {remote.get('store')!r}; kept locally")
        return None
    if remote.get("store") == "github":
        choice = StoreChoice(kind="github", key_suffix=str(remote.get("key_suffix") or ""))
    else:
        choice = StoreChoice(kind="s3", url=str(remote.get("url") or "") or None)
    check_settings(choice)
    try:
        return tier_for(choice, state["scope_key"])
    except Exception as exc:  # a state file edited by hand: not a reason to fail the job
        gha.warn(f"remote tier of the restore unusable ({exc}); kept locally")
        return None


def publish_from_state(
    layout: Layout,
    state: dict[str, Any],
    result: dict[str, Any],
    committed: mf.Committed | None,
    signing_key: str | None,
    tier: RemoteTier | None,
) -> dict[str, Any]:
    """After the local save `result` of restore's `state`: publish what `tier` (remote_tier's,
    made before the save) lacks of `committed`, the manifest that save checked and signed
    under the scope's lock (never the disk's manifest.json, which is unlocked by now)."""
    if tier is None or not result.get("saved") or committed is None:
        return result
    if not (tier.publishes_every_save or result.get("added")):
        result["remote"] = {"store": tier.name, "url": tier.describe(), "published": False,
                            "reason": "this run added nothing to the cache"}  # fmt: skip
        return result
    _fault_stop()
    result["remote"] = publish_scope(layout, state["scope_key"], tier, committed, signing_key)
    return result


def _fault_stop() -> None:
    """Test-only (store.save.FAULT_ENV `stop-before-publish`): the process stops itself
    between the local commit and the publish, so a test can swap the scope's files then and
    continue it (SIGCONT)."""
    if os.environ.get(store_save.FAULT_ENV) == "stop-before-publish":
        print("fxcache: test fault: committed, stopped before the publish", flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)
