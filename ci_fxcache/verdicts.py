"""Evidence of a phase, and the verdict of a combination from its cold and hot evidence."""

from __future__ import annotations

from typing import Any

from ci_fxcache.workerpool import Outcome

VERDICTS = ("safe", "no-gain", "unsafe", "error", "skipped")


def evidence(outcome: Outcome, timeout: float) -> dict[str, Any]:
    """The results document's phase object for one child's outcome."""
    result = outcome.result or {}
    error: str | None
    if outcome.timed_out:
        status, error = "timeout", f"timed out after {timeout:g} s"
    elif outcome.signal:
        status, error = "crash", f"killed by {outcome.signal}"
    elif outcome.result is None:
        status = "error"
        error = f"exited with status {outcome.returncode} without a result"
    else:
        status, error = str(result.get("status", "error")), result.get("error")
    phase: dict[str, Any] = {
        "status": status,
        "compile_s": result.get("compile_s"),
        "wall_s": result.get("wall_s"),
        "counters": result.get("counters", {}),
        "returncode": outcome.returncode,
        "signal": outcome.signal,
        "log_tail": outcome.log_tail,
    }
    for name in (
        "recompiles",
        "kernels_built",
        "load_s",
        "artifacts_loaded",
        "kernel_builds",
        "eager_reproducible",
        "eager_note",
        "notes",
    ):
        if name in result:
            phase[name] = result[name]
    if error:
        phase["error"] = error
    return phase


def not_run(reason: str) -> dict[str, Any]:
    """Phase object for a phase that never ran."""
    return {
        "status": "not-run",
        "compile_s": None,
        "wall_s": None,
        "counters": {},
        "returncode": None,
        "signal": None,
        "log_tail": "",
        "error": reason,
    }


def hits_and_misses(mechanism: str, counters: dict[str, int]) -> tuple[int, int, str]:
    """Hits, misses and a short description of the counters that matter for `mechanism`."""
    names: tuple[str, ...]
    if mechanism == "precompile":
        names = ("dynamo_cache_hit", "dynamo_cache_miss", "dynamo_cache_error")
        hits = counters.get("dynamo_cache_hit", 0)
        misses = counters.get("dynamo_cache_miss", 0) + counters.get("dynamo_cache_error", 0)
    else:
        names = (
            "fxgraph_cache_hit",
            "aot_autograd_cache_hit",
            "fxgraph_cache_miss",
            "fxgraph_cache_bypass",
            "aot_autograd_cache_miss",
        )
        hits = counters.get("fxgraph_cache_hit", 0) + counters.get("aot_autograd_cache_hit", 0)
        misses = (
            counters.get("fxgraph_cache_miss", 0)
            + counters.get("fxgraph_cache_bypass", 0)
            + counters.get("aot_autograd_cache_miss", 0)
        )
    shown = ", ".join(f"{n.replace('_cache', '')} {counters[n]}" for n in names if counters.get(n))
    return hits, misses, shown or "no cache counters"


def _why(phase: dict[str, Any]) -> str:
    tail = [line for line in (phase.get("log_tail") or "").splitlines() if line.strip()]
    last = f": {tail[-1].strip()[:200]}" if tail and phase["status"] != "timeout" else ""
    return f"{phase.get('error') or phase['status']}{last}"


def judge(
    combo: dict[str, Any],
    cold: dict[str, Any],
    hot: dict[str, Any],
    cold_result: dict[str, Any],
    hot_result: dict[str, Any],
    settings: dict[str, Any],
) -> dict[str, Any]:
    """Verdict, one-line reason and the numbers behind it (the results document's combo)."""
    out: dict[str, Any] = {
        "speedup": None,
        "cold": cold,
        "hot": hot,
        "max_abs_err": {
            "hot_vs_cold": (hot_result.get("vs_cold") or {}).get("max_abs_err"),
            "cold_vs_eager": (cold_result.get("vs_eager") or {}).get("max_abs_err"),
        },
        "tolerance": cold_result.get("tolerance") or hot_result.get("tolerance"),
        "hits": 0,
        "misses": 0,
    }

    def verdict(name: str, reason: str) -> dict[str, Any]:
        return {"verdict": name, "reason": reason, **out}

    if cold["status"] != "ok":
        return verdict("error", f"cold compile failed ({_why(cold)}); not a cache problem")
    vs_eager = cold_result.get("vs_eager")
    if vs_eager is not None and not vs_eager["close"]:
        return verdict(
            "unsafe",
            f"cold compiled output differs from eager beyond the {combo['dtype']} tolerance "
            f"(max abs err {vs_eager['max_abs_err']}; {vs_eager['detail']})",
        )
    if hot["status"] == "not-run":
        return verdict("error", hot.get("error") or "hot phase did not run")
    if hot["status"] == "crash":
        return verdict("unsafe", f"hot process crashed ({_why(hot)})")
    if hot["status"] == "timeout":
        return verdict("unsafe", f"hot phase {_why(hot)} (hang?)")
    if hot["status"] != "ok":
        return verdict("unsafe", f"hot phase failed ({_why(hot)})")
    hits, misses, shown = hits_and_misses(combo["mechanism"], hot["counters"])
    out["hits"], out["misses"] = hits, misses
    if cold.get("compile_s") and hot.get("compile_s"):
        out["speedup"] = round(cold["compile_s"] / max(hot["compile_s"], 1e-6), 2)
    vs_cold = hot_result.get("vs_cold") or {}
    bitwise = settings["compare"] == "bitwise"
    if not vs_cold.get("bitwise" if bitwise else "close", False):
        how = "bitwise" if bitwise else f"{combo['dtype']} tolerance"
        detail = f"; {vs_cold['detail']}" if vs_cold.get("detail") else ""
        return verdict(
            "unsafe",
            f"hot outputs differ from the cold compile ({how} comparison, max abs err "
            f"{vs_cold.get('max_abs_err')}{detail})",
        )
    if hot.get("recompiles"):
        also = (
            "; it recompiled in the cold process too: the compiled graph did not generalise "
            "to the second shape (e.g. duck sizing tied the batch to another dimension)"
            if cold.get("recompiles")
            else ""
        )
        error = str(hot_result.get("recompile_error", "recompile")).split(". ")[0]
        return verdict(
            "unsafe", f"the second input shape recompiled in the hot process ({error}){also}"
        )
    same = "bitwise equal" if bitwise else "within tolerance"
    speed = f"{out['speedup']}x" if out["speedup"] is not None else "speedup unknown"
    if hits == 0 or misses:
        return verdict("no-gain", f"hot load missed ({shown}); outputs {same}, {speed}")
    min_speedup = float(settings["min_speedup"])
    built = hot.get("kernels_built") or 0
    if built:
        # A "hit" that still compiles kernels is a partial hot load (mega-cache on CPU): the
        # counters look fine, but the cost grows with the model's kernel count.
        return verdict(
            "no-gain",
            f"counters report a hit ({shown}) but the hot process rebuilt {built} C++ "
            f"kernels ({speed}); outputs {same}",
        )
    if out["speedup"] is None or out["speedup"] < min_speedup:
        return verdict(
            "no-gain", f"hot load hit ({shown}) but only {speed} < {min_speedup:g}x; outputs {same}"
        )
    return verdict("safe", f"hot load hit ({shown}), outputs {same}, {speed} faster")


def summary(combos: list[dict[str, Any]]) -> dict[str, int]:
    """Count of each verdict."""
    counts = dict.fromkeys(VERDICTS, 0)
    for combo in combos:
        counts[combo["verdict"]] += 1
    return counts
