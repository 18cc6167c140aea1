"""Recommendations: for each problem row, the single best alternative this run verified as safe.

Alternatives are chosen only among combinations that the same run verified as safe, on the same
environment, for the same workload, device and training mode; in a fleet, one safe on every other
environment comes first, and one that is not says where. A change of how the model runs (static
shapes instead of dynamic ones, another dtype) says so: it is not a cache setting. Failures the
report attributes to the compiler get no cache advice; "disable the cache" is said once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ci_fxcache.report.labels import COMPILER_CAUSES, carried_from, fmt_speedup, short_dtype
from ci_fxcache.verify import workarounds

DISABLE_LINE = "Where no alternative fits, disable the cache for that model."
NOTHING_SAFE = "nothing for this model was verified safe in this run"
NOT_THE_CACHE = (
    "not a cache problem: fix or report the compile (see its log); no cache change helps"
)


# workload, device, training mode, compile mode: what an alternative must share
Model = tuple[str, str, str, str]


def same_model(c: dict[str, Any]) -> Model:
    """What an alternative must share with the problem row: workload, device, training mode,
    compile mode."""
    mode = str(c.get("mode") or "default")
    return (str(c["workload"]), str(c["device"]), str(c.get("training")), mode)


def _rank(bad: dict[str, Any], good: dict[str, Any]) -> int:
    """How small a change `good` is from `bad` (lower is smaller)."""
    same_dtype = good["dtype"] == bad["dtype"]
    same_dyn = str(good["dynamic"]) == str(bad["dynamic"])
    same_mech = good["mechanism"] == bad["mechanism"]
    if same_dtype and same_mech:
        return 0  # only the dynamic mode changes
    if same_dtype and same_dyn:
        return 1  # only the cache mechanism changes
    if "autocast" in str(good["dtype"]) and same_dyn:
        return 2  # keeps the shapes dynamic and bf16 speed, through autocast over an fp32 model
    if same_dtype:
        return 3
    if same_dyn and same_mech:
        return 4
    return 5


def best_alternative(
    bad: dict[str, Any],
    safe_by_model: dict[Model, list[dict[str, Any]]],
    not_safe_on: Callable[[dict[str, Any]], list[str]] = lambda c: [],
) -> dict[str, Any] | None:
    """The smallest verified-safe change from `bad` (fastest first among equals), one safe
    everywhere else (`not_safe_on` names where it is not) before any other; or None."""
    candidates = safe_by_model.get(same_model(bad), [])
    if not candidates:
        return None
    return min(
        candidates,
        key=lambda g: (
            bool(not_safe_on(g)),
            _rank(bad, g),
            -float(g.get("speedup") or 0),
            str(g["id"]),
        ),
    )


def model_change(bad: dict[str, Any], good: dict[str, Any]) -> str:
    """What `good` changes in how the model runs, beyond the cache ('' when nothing)."""
    bad_dyn, good_dyn = str(bad["dynamic"]).lower(), str(good["dynamic"]).lower()
    changes = []
    if good_dyn == "false" and bad_dyn != "false":
        changes.append("static shapes: each new input shape recompiles")
    elif good_dyn != bad_dyn:
        changes.append("other dynamic-shape handling")
    if good["dtype"] != bad["dtype"] and "autocast" not in str(good["dtype"]):
        changes.append(f"runs in {short_dtype(str(good['dtype']))}")
    if not changes:
        return ""
    return "changes how the model runs (" + "; ".join(changes) + "), not only the cache"


def advice(
    bad: dict[str, Any],
    cause: str,
    alternative: dict[str, Any] | None,
    alt_label: str,
    not_safe_on: list[str] | None = None,
) -> str:
    """What to do instead of `bad`, in one clause (without its label): a known upstream
    failure's workaround first where this run verified it."""
    verified = verified_workaround(bad)
    if verified and (cause in COMPILER_CAUSES or alternative is None):
        return verified
    instead = _instead(bad, cause, alternative, alt_label, not_safe_on)
    return f"{verified}; or {instead}" if verified else instead


def _instead(
    bad: dict[str, Any],
    cause: str,
    alternative: dict[str, Any] | None,
    alt_label: str,
    not_safe_on: list[str] | None,
) -> str:
    if cause in COMPILER_CAUSES:
        return NOT_THE_CACHE
    if alternative is None:
        return NOTHING_SAFE
    speed = fmt_speedup(alternative.get("speedup"))
    where = f"; not safe on {', '.join(not_safe_on)}" if not_safe_on else ""
    change = model_change(bad, alternative)
    change = f"; {change}" if change else ""
    if "autocast" in str(alternative["dtype"]):
        return (
            f"use {alt_label}: an fp32 model under autocast (verified safe, {speed}{where})"
            + change
        )
    return f"use {alt_label} (verified safe, {speed}{where}){change}"


def verified_workaround(combo: dict[str, Any]) -> str:
    """`<the workaround>: verified on this runner` where this run verified a known upstream
    failure's workaround for `combo` (the wording is the report's, never the document's); a
    verdict carried from the run that built the cache says that run verified it, not this one."""
    found = workarounds.verified(combo)
    if found is None:
        return ""
    when = carried_from(combo)
    if when is not None:
        return (
            f"{found.advice}: verified when this cache was built ({when}), not re-checked this run"
        )
    return f"{found.advice}: {workarounds.VERIFIED}"


def group_safe(combos: list[dict[str, Any]]) -> dict[Model, list[dict[str, Any]]]:
    """Safe combinations by model, for `best_alternative`."""
    out: dict[Model, list[dict[str, Any]]] = {}
    for c in combos:
        if c["verdict"] == "safe":
            out.setdefault(same_model(c), []).append(c)
    return out
