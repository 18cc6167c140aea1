"""Stale-on-upgrade: scopes saved only by this same environment (the same torch installation
path, recorded in each manifest) when it had other torch / CUDA / HIP / triton / Python
versions. Scopes of other interpreters, or shared with them, are left to `fxcache invalidate`."""

from __future__ import annotations

import os
import sys
from collections import defaultdict
from typing import Any

from ci_fxcache import gha
from ci_fxcache.env import scopekey
from ci_fxcache.env.fingerprint import Fingerprint
from ci_fxcache.store import manifest as mf
from ci_fxcache.store import scopes
from ci_fxcache.store.layout import Layout
from ci_fxcache.store.policies import human_bytes

# (label, fingerprint field) compared through each scope's stored fingerprint.
_FIELDS = (
    ("torch", "torch_version"),
    ("torch build", "torch_git_version"),
    ("CUDA", "cuda_version"),
    ("HIP", "hip_version"),
    ("triton", "triton_version"),
    ("Python", "python_version"),
)


def only_this_environment(manifest: dict[str, Any], fp: Fingerprint) -> bool:
    """True when every torch installation that saved the scope is the one `fp` uses now."""
    stored = manifest.get("fingerprint") or {}
    paths = manifest.get("torch_paths") or [stored.get("torch_path")]
    if not fp.torch_path or not all(isinstance(p, str) and p for p in paths):
        return False
    here = os.path.realpath(fp.torch_path)
    return all(os.path.realpath(p) == here for p in paths)


def version_changes(stored: dict[str, Any], fp: Fingerprint) -> list[str]:
    """`torch 2.13.0+cpu -> 2.14.1+cu130`-style lines for each version that differs."""
    changes: list[str] = []
    for label, name in _FIELDS:
        if name not in stored:
            continue
        old, new = stored.get(name), getattr(fp, name)
        if old != new and not (label == "torch build" and changes):
            changes.append(f"{label} {old or 'none'} -> {new or 'none'}")
    return changes


def find_stale(layout: Layout, current_key: str, fp: Fingerprint) -> list[tuple[str, str]]:
    """(scope key, version change) of each scope this environment saved before an upgrade."""
    current = scopekey.parse(current_key)
    assert current is not None
    stale = []
    for key in layout.scope_keys():
        parsed = scopekey.parse(key)
        if parsed is None or parsed.scope == current.scope:
            continue
        if (parsed.os, parsed.machine) != (current.os, current.machine):
            continue  # GPU archs may differ: a +cpu torch replaced by a CUDA build is an upgrade
        try:
            manifest = mf.load(layout.manifest(key))
        except (mf.ManifestError, PermissionError):
            continue  # whose it was is unknown: left to `fxcache invalidate`
        if not only_this_environment(manifest, fp):
            continue
        changes = version_changes(manifest.get("fingerprint") or {}, fp)
        if changes:
            stale.append((key, ", ".join(changes)))
    return stale


def remove_stale(layout: Layout, current_key: str, fp: Fingerprint) -> list[dict[str, Any]]:
    """Remove stale scopes (skipping any a job is still writing); print one line per change."""
    removed: list[dict[str, Any]] = []
    for key, versions in find_stale(layout, current_key, fp):
        try:
            with scopes.lock(layout, key):
                if scopes.live_leases(layout, key) or not layout.scope(key).exists():
                    continue
                size = scopes.remove(layout, key)
        except OSError as exc:
            gha.warn(f"could not remove stale scope {key}: {exc}")
            continue
        except TimeoutError:
            continue
        removed.append({"scope": key, "reason": "upgrade", "versions": versions, "bytes": size})
    groups: dict[str, list[int]] = defaultdict(list)
    for item in removed:
        groups[item["versions"]].append(item["bytes"])
    for versions, sizes in groups.items():
        count = len(sizes)
        print(
            f"fxcache: {versions}: removed {count} scope{'s' if count != 1 else ''}, "
            f"{human_bytes(sum(sizes))}",
            file=sys.stderr,
            flush=True,
        )
    return removed
