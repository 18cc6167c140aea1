"""Stale-on-upgrade: scopes of this runner architecture built by other torch / CUDA / HIP /
triton / Python versions than the current fingerprint."""

from __future__ import annotations

import contextlib
import sys
from collections import defaultdict
from typing import Any

from ci_fxcache import gha, scopekey
from ci_fxcache.fingerprint import Fingerprint
from ci_fxcache.store import manifest as mf
from ci_fxcache.store import scopes
from ci_fxcache.store.layout import Layout

# (label, fingerprint field) compared through each scope's stored fingerprint.
_FIELDS = (
    ("torch", "torch_version"),
    ("CUDA", "cuda_version"),
    ("HIP", "hip_version"),
    ("triton", "triton_version"),
    ("Python", "python_abi"),
)


def _differences(parsed: scopekey.ParsedKey, stored: dict[str, Any], fp: Fingerprint) -> list[str]:
    current = scopekey.parse(scopekey.scope_key(fp))
    assert current is not None
    diffs: list[str] = []
    # The readable parts of the key first: they work even without a manifest.
    if parsed.torch != current.torch:
        diffs.append(f"torch {parsed.torch} -> {current.torch}")
    if parsed.accel != current.accel:
        diffs.append(f"{parsed.accel} -> {current.accel}")
    if parsed.abi != current.abi:
        diffs.append(f"Python {parsed.abi} -> {current.abi}")
    for label, name in _FIELDS:
        if name not in stored:
            continue
        old, new = stored.get(name), getattr(fp, name)
        text = f"{label} {old or 'none'} -> {new or 'none'}"
        if old != new and not any(d.startswith(label + " ") for d in diffs):
            diffs.append(text)
    return diffs


def find_stale(layout: Layout, current_key: str, fp: Fingerprint) -> list[tuple[str, str]]:
    """(scope key, version change) of each stale scope in the root."""
    current = scopekey.parse(current_key)
    assert current is not None
    stale = []
    for key in layout.scope_keys():
        parsed = scopekey.parse(key)
        if parsed is None or parsed.scope == current.scope:
            continue
        if parsed.runner_arch != current.runner_arch:
            continue
        stored: dict[str, Any] = {}
        with contextlib.suppress(mf.ManifestError):
            stored = mf.load(layout.manifest(key)).get("fingerprint") or {}
        diffs = _differences(parsed, stored, fp)
        if diffs:
            stale.append((key, ", ".join(diffs)))
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
            f"{scopes.human_bytes(sum(sizes))}",
            file=sys.stderr,
            flush=True,
        )
    return removed
