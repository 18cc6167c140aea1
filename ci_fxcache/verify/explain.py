"""Why a hot phase missed or rebuilt: the parts of torch's cache keys that differ from cold.

Reads the `keyinfo` each phase recorded (`ci_fxcache.worker.keyinfo`): every FX graph and
AOTAutograd cache lookup with its key components, and the system facts the Dynamo cache checks.
Each hot lookup that did not hit is compared with the most similar cold lookup of the same cache;
the components whose hashes differ are what changed the key.
"""

from __future__ import annotations

import re
from typing import Any

CACHE_NAMES = {"fxgraph": "FX graph cache", "aotautograd": "AOTAutograd cache"}
TAG_COMPONENT = "TORCH_COMPILE_CACHE_KEY_TAG"
UNSAVED = "a graph the cold phase also missed and torch never saved"
# System facts (the Dynamo cache's SystemInfo) by their readable name.
SYSTEM_NAMES = {
    "python_version": "Python version",
    "torch_version": "torch version",
    "toolkit_version": "CUDA/HIP version",
    "triton_version": "Triton version",
    "gpu_name": "GPU name",
    "cache_key_tag": TAG_COMPONENT,
}
# Key components whose name alone is not self-explanatory.
_COMPONENT_NAMES = {
    "cache_key_tag": TAG_COMPONENT,
    "torch_version": "torch source hash",
    "system_info[device]": "GPU name",
    "system_info[version]": "CUDA/HIP/Triton version",
    "system_info[hash]": "GPU toolchain hash",
    "gm": "traced FX graph",
    "autograd_config": "functorch config",
    "default_dtype": "default dtype",
    "cpp_runtime_thread_count": "C++ kernel thread count",
}
# What torch keys on and the scope key leaves out (docs/scope-key.md has the whole table): when
# one of these differs between cold and hot, the miss is named with the reason it can happen
# inside one scope.
NOT_IN_SCOPE = {
    "Python version": "caching precompile refuses other Python versions; the scope keys only "
    "the ABI (cp312), not the patch release",
    "torch source hash": "torch keys a hash of its installed source files; the scope keys the "
    "version and git commit, so a rebuilt or patched torch of one version shares the scope",
    "CUDA/HIP/Triton version": "torch keys Triton's source hash; the scope keys Triton's "
    "version, so a rebuilt Triton of one version shares the scope",
    "GPU toolchain hash": "torch hashes the current GPU's name with the CUDA/HIP and Triton "
    "builds; the scope keys every visible model, not which one comes first",
    "GPU name": "torch keys the current device's name (the first that CUDA_VISIBLE_DEVICES "
    "leaves); the scope keys every visible model, not which one comes first",
    "C++ kernel thread count": "torch keys the thread count its C++ kernels were built for "
    "(torch.get_num_threads()); the scope does not hold the number of usable CPUs",
    TAG_COMPONENT: "torch's own cache breaker; fxcache's is --salt (FXCACHE_KEY_SALT)",
}
_INDEXED = re.compile(r"^(?P<base>\w+)\[(?P<item>[^\]]+)\]$")
_INDEXED_NAMES = {
    "inductor_config": "inductor config {}",
    "inductor_config_comms": "inductor comms config {}",
    "fx_kwargs": "compile option {}",
    "example_inputs": "input {} (dtype, shape, stride)",
}


def component_name(name: str) -> str:
    """The readable name of a key component as torch names it (`inductor_config[x]`...)."""
    if name in _COMPONENT_NAMES:
        return _COMPONENT_NAMES[name]
    match = _INDEXED.match(name)
    if match and match["base"] in _INDEXED_NAMES:
        return _INDEXED_NAMES[match["base"]].format(match["item"])
    return name


# Order of the differing components: the likeliest causes first.
_FIRST = ("cache_key_tag", "torch_version", "system_info", "example_inputs", "inductor_config")


def _rank(name: str) -> tuple[int, str]:
    return next((i for i, p in enumerate(_FIRST) if name.startswith(p)), len(_FIRST)), name


def _lookups(result: dict[str, Any]) -> list[dict[str, Any]]:
    return list((result.get("keyinfo") or {}).get("lookups") or [])


def _differing(cold: dict[str, Any], hot: dict[str, Any]) -> list[str]:
    a, b = cold.get("components") or {}, hot.get("components") or {}
    names = (n for n in a.keys() | b.keys() if (a.get(n) or [None])[0] != (b.get(n) or [None])[0])
    return sorted(names, key=_rank)


def _shown(entry: list[Any] | None) -> Any:
    """A component's value, or its hash where the value is not text (None when absent)."""
    if not entry:
        return None
    return entry[1] if entry[1] is not None else f"hash {entry[0]}"


def _nearest(hot: dict[str, Any], cold: list[dict[str, Any]]) -> dict[str, Any] | None:
    same = [c for c in cold if c["cache"] == hot["cache"] and c.get("components")]
    return min(same, key=lambda c: len(_differing(c, hot)), default=None)


def _system_differs(cold: dict[str, Any], hot: dict[str, Any]) -> list[dict[str, Any]]:
    a = (cold.get("keyinfo") or {}).get("system") or {}
    b = (hot.get("keyinfo") or {}).get("system") or {}
    return [
        {"component": label, "cold": a.get(name), "hot": b.get(name)}
        for name, label in SYSTEM_NAMES.items()
        if a and b and a.get(name) != b.get(name)
    ]


def _unsaved(cold: dict[str, Any]) -> tuple[set[str], int]:
    """AOTAutograd keys the cold phase missed, and how many of its misses it never saved.

    torch counts every AOTAutograd save (`aot_autograd_cache_saved`); when the cold phase saved
    fewer entries than it missed, some graph was never stored (a training graph whose entry torch
    does not write), so that many hot misses on those exact keys are the same outcome as cold's,
    not a lost entry. When every cold miss was saved, no hot miss is excused."""
    misses = [c for c in _lookups(cold) if c["cache"] == "aotautograd" and c["state"] == "miss"]
    unsaved = len(misses) - int((cold.get("counters") or {}).get("aot_autograd_cache_saved", 0))
    return {str(c["key"]) for c in misses if c.get("key")}, max(unsaved, 0)


def _excused(cold: dict[str, Any], hot: dict[str, Any]) -> dict[int, dict[str, str]]:
    """Hot lookups (by index) that did not hit but fared as in the cold phase: bypasses for the
    same reason, and up to the unsaved count of misses on keys the cold phase missed too."""
    bypassed = {
        (c["cache"], c.get("bypass_reason")) for c in _lookups(cold) if c["state"] == "bypass"
    }
    cold_missed, allowance = _unsaved(cold)
    found: dict[int, dict[str, str]] = {}
    for i, lookup in enumerate(_lookups(hot)):
        cache, state = lookup["cache"], lookup["state"]
        if state == "bypass" and (cache, lookup.get("bypass_reason")) in bypassed:
            found[i] = {"cache": cache, "reason": str(lookup.get("bypass_reason") or "")}
        elif state == "miss" and cache == "aotautograd" and str(lookup.get("key")) in cold_missed:
            if allowance <= 0:
                continue
            allowance -= 1
            found[i] = {"cache": cache, "reason": UNSAVED}
    return found


def uncacheable(cold: dict[str, Any], hot: dict[str, Any]) -> list[dict[str, str]]:
    """What the hot phase could not load because the cold phase could not store it either."""
    return _distinct(_excused(cold, hot))


def _distinct(excused: dict[int, dict[str, str]]) -> list[dict[str, str]]:
    found: list[dict[str, str]] = []
    for entry in excused.values():
        if entry not in found:
            found.append(entry)
    return found


def explain(cold: dict[str, Any], hot: dict[str, Any]) -> dict[str, Any]:
    """What made the hot phase miss: `{"differs", "misses", "uncacheable"}` (see the module doc).

    `cold`/`hot` are the worker results. `misses` lists the hot lookups that missed or bypassed
    where the cold phase did not bypass alike; `differs` names the key components behind them.
    """
    cold_lookups = _lookups(cold)
    excused = _excused(cold, hot)
    skipped = _distinct(excused)
    differs: list[dict[str, Any]] = []
    misses: list[dict[str, Any]] = []
    for i, lookup in enumerate(_lookups(hot)):
        if lookup["state"] == "hit" or i in excused:
            continue
        fields = ("cache", "state", "key", "bypass_reason")
        misses.append({k: lookup[k] for k in fields if lookup.get(k)})
        nearest = _nearest(lookup, cold_lookups)
        if nearest is None:
            continue
        for name in _differing(nearest, lookup):
            change = {
                "component": component_name(name),
                "cold": _shown((nearest.get("components") or {}).get(name)),
                "hot": _shown((lookup.get("components") or {}).get(name)),
            }
            if change not in differs:
                differs.append(change)
    system = _system_differs(cold, hot)
    differs = system + [d for d in differs if all(d["component"] != s["component"] for s in system)]
    for change in differs:
        if change["component"] in NOT_IN_SCOPE:
            change["why"] = NOT_IN_SCOPE[change["component"]]
    return {"differs": differs, "misses": misses, "uncacheable": skipped}


def missed(combo: dict[str, Any]) -> bool:
    """True when a results-document combo's hot load missed the cache (any schema version)."""
    if "cause" in combo:
        return combo["cause"] == "miss"
    return combo.get("verdict") == "no-gain" and (
        not combo.get("hits") or bool(combo.get("misses"))
    )


def summary(why: dict[str, Any], limit: int = 3) -> str:
    """One line naming the differing components, e.g. `Python version '3.12.3' -> '3.12.4':
    caching precompile refuses other Python versions; ...` (the reason where the scope key
    leaves the component out)."""
    parts = [
        f"{d['component']} {d['cold']!r} -> {d['hot']!r}"
        + (f": {d['why']}" if d.get("why") else "")
        for d in why.get("differs", [])
    ]
    more = f" (+{len(parts) - limit} more)" if len(parts) > limit else ""
    return "; ".join(parts[:limit]) + more


def uncacheable_text(part: dict[str, str]) -> str:
    """`AOTAutograd cache bypass: <torch's reason>` for a `notes` entry."""
    if part["reason"] == UNSAVED:
        return f"{CACHE_NAMES.get(part['cache'], part['cache'])}: {UNSAVED} (cold and hot alike)"
    reason = part["reason"].split(". ")[0].splitlines()[0] if part["reason"] else "no reason"
    return f"{CACHE_NAMES.get(part['cache'], part['cache'])} bypass (cold and hot alike): {reason}"
