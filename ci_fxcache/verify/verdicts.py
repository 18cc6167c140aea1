"""Evidence of a phase, and the verdict of a combination from its cold and hot evidence."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ci_fxcache import mechanisms
from ci_fxcache.verify import artifact_evidence, causes, workarounds
from ci_fxcache.verify import explain as key_explain
from ci_fxcache.verify.forkserver import Outcome


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
        "pid",
        "recompiles",
        "kernels_built",
        "kernels_from_memo",
        "load_s",
        "artifacts_loaded",
        "kernel_builds",
        "eager_reproducible",
        "eager_note",
        "self_stable",
        "self_stable_detail",
        "recompile_guard",
        "tracing_s",
        "autotune",
        "cudagraph_capture_s",
        "triton_kernels_built",
        "triton_kernel_builds",
        "triton_count",
        "triton_uncounted",
        "triton_driver_builds",
        "artifact",
        "notes",
        "rank",  # one rank of several (verify/ranks.py)
        "rank_wrapper",
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


def _hits_from(mechanism: str) -> str:
    """What shows `mechanism`'s hits (its record's `hits`; the caches' counters when unknown)."""
    record = mechanisms.find(mechanism)
    return "caches" if record is None else record.hits


def hits_and_misses(mechanism: str, counters: dict[str, int]) -> tuple[int, int, str]:
    """Hits, misses and a short description of the counters that matter for `mechanism`."""
    names: tuple[str, ...]
    if _hits_from(mechanism) == "dynamo":
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


def _hits(mechanism: str, hot: dict[str, Any]) -> tuple[int, int, str]:
    """`hits_and_misses` for a cache mechanism; the artifact's load for an artifact one."""
    if artifact_evidence.judges(mechanism):
        return artifact_evidence.hits_and_misses(hot)
    return hits_and_misses(mechanism, hot["counters"])


def _why(phase: dict[str, Any]) -> str:
    tail = [line for line in (phase.get("log_tail") or "").splitlines() if line.strip()]
    last = f": {tail[-1].strip()[:200]}" if tail and phase["status"] != "timeout" else ""
    return f"{phase.get('error') or phase['status']}{last}"


@dataclass
class Evidence:
    """What the checks look at: both phases, the worker's results and the settings."""

    combo: dict[str, Any]
    cold: dict[str, Any]
    hot: dict[str, Any]
    cold_result: dict[str, Any]
    hot_result: dict[str, Any]
    settings: dict[str, Any]
    hits: int = 0
    misses: int = 0
    counters_shown: str = ""
    speedup: float | None = None  # as recorded: rounded, never across the floor
    ratio: float | None = None  # cold / hot compile time, unrounded: what a floor compares
    why: dict[str, Any] = field(default_factory=dict)  # explain(): differing key parts, misses

    @property
    def bitwise(self) -> bool:
        """Whether hot is compared with cold bit for bit (else within the dtype tolerance): only
        when both phases found the compiled model bitwise stable against itself."""
        return (
            self.settings["compare"] == "bitwise"
            and self.cold_result.get("self_stable", True) is not False
            and self.hot_result.get("self_stable", True) is not False
        )

    @property
    def hot_ran(self) -> bool:
        return self.hot["status"] == "ok"

    @property
    def outputs(self) -> str:
        return "bitwise equal" if self.bitwise else "within tolerance"

    @property
    def speed(self) -> str:
        if self.speedup is not None:
            return f"{self.speedup}x"
        if shared_builds(self.cold, self.hot):
            return "speedup not measured: this run built those kernels once for all its phases"
        return "speedup unknown"

    @property
    def floor(self) -> float | None:
        """`--min-speedup`: a time floor only where the user asked for one (None: no floor;
        0 asks for nothing, so a speedup the run could not measure passes it too)."""
        value = self.settings.get("min_speedup")
        return float(value) if value else None


Finding = tuple[str, str, str]  # (verdict, cause, reason)


def _cold_failed(ev: Evidence) -> Finding | None:
    if ev.cold["status"] == "ok":
        return None
    return "error", "cold-error", f"cold compile failed ({_why(ev.cold)}); not a cache problem"


def _hot_crashed(ev: Evidence) -> Finding | None:
    if ev.hot["status"] != "crash":
        return None
    return "unsafe", "crash", f"hot process crashed ({_why(ev.hot)})"


def _hot_timed_out(ev: Evidence) -> Finding | None:
    if ev.hot["status"] != "timeout":
        return None
    return "unsafe", "timeout", f"hot phase {_why(ev.hot)} (hang?)"


def _hot_failed(ev: Evidence) -> Finding | None:
    if ev.hot["status"] in ("ok", "not-run"):
        return None
    return "unsafe", "hot-error", f"hot phase failed ({_why(ev.hot)})"


def _hot_mismatch(ev: Evidence) -> Finding | None:
    if not ev.hot_ran:
        return None
    vs_cold = ev.hot_result.get("vs_cold") or {}
    if vs_cold.get("bitwise" if ev.bitwise else "close", False):
        return None
    how = "bitwise" if ev.bitwise else f"{ev.combo['dtype']} tolerance"
    detail = f"; {vs_cold['detail']}" if vs_cold.get("detail") else ""
    return (
        "unsafe",
        "hot-mismatch",
        f"hot outputs differ from the cold compile ({how} comparison, max abs err "
        f"{vs_cold.get('max_abs_err')}{detail})",
    )


def _hot_recompiled(ev: Evidence) -> Finding | None:
    # A second shape that recompiles in the cold process too is the model's (a note), not
    # the cache's: only a recompile that the cold process did not need is unsafe.
    if not ev.hot_ran or not ev.hot.get("recompiles") or ev.cold.get("recompiles"):
        return None
    guard = str(ev.hot_result.get("recompile_guard") or ev.hot_result.get("recompile_error"))
    return (
        "unsafe",
        "recompile",
        f"the second input shape recompiled in the hot process but not in the cold one ({guard})",
    )


def _compiler_mismatch(ev: Evidence) -> Finding | None:
    vs_eager = ev.cold_result.get("vs_eager")
    if vs_eager is None or vs_eager["close"]:
        return None
    return (
        "error",
        "compiler-mismatch",
        f"the cold compile differs from eager beyond the {ev.combo['dtype']} accuracy check "
        f"(max abs err {vs_eager['max_abs_err']}; {vs_eager['detail']}): a compiler problem, "
        "not a cache problem",
    )


def _hot_not_run(ev: Evidence) -> Finding | None:
    if ev.hot["status"] != "not-run":
        return None
    return "error", "not-run", ev.hot.get("error") or "hot phase did not run"


def _refused(ev: Evidence) -> Finding | None:
    # The worker fell back to compiling, as a job that catches the refusal would: not a wrong
    # result, but no gain (a job that loads the artifact without a fallback fails here).
    why = artifact_evidence.refusal(ev.hot) if ev.hot_ran else None
    if why is None:
        return None
    return (
        "no-gain",
        "refused",
        f"torch refused the artifact ({why}); the hot process compiled instead, outputs "
        f"{ev.outputs}, {ev.speed} (a job without a fallback fails on this load)",
    )


def _autotuned(ev: Evidence) -> Finding | None:
    # Autotuning is the slowest part of a max-autotune compile (benchmarking each choice): a
    # hot process that benchmarks again, whatever else it loaded, redid what the cache holds.
    tuned = ev.hot.get("autotune") if ev.hot_ran else None
    if not tuned:
        return None
    runs = sum(int(n) for n in (tuned.get("counters") or {}).values())
    return (
        "no-gain",
        "autotuned",
        f"autotuning ran again in the hot process: {float(tuned.get('s') or 0):.0f} s "
        f"({runs} autotuning run(s); hot load: {ev.counters_shown}); outputs {ev.outputs}, "
        f"{ev.speed}",
    )


def _missed(ev: Evidence) -> Finding | None:
    if ev.hits and not ev.misses:
        return None
    named = f"; key differs: {key_explain.summary(ev.why)}" if ev.why.get("differs") else ""
    return (
        "no-gain",
        "miss",
        f"hot load missed ({ev.counters_shown}{named}); outputs {ev.outputs}, {ev.speed}",
    )


def _rebuilt(ev: Evidence) -> Finding | None:
    # A "hit" that still compiles kernels is a partial hot load (mega-cache on CPU): the
    # counters look fine, but the cost grows with the model's kernel count.
    cpp, triton = ev.hot.get("kernels_built") or 0, ev.hot.get("triton_kernels_built") or 0
    if not (cpp or triton):
        return None
    kinds = " and ".join(f"{n} {k}" for n, k in ((cpp, "C++"), (triton, "Triton")) if n)
    return (
        "no-gain",
        "rebuilt",
        f"counters report a hit ({ev.counters_shown}) but the hot process rebuilt {kinds} "
        f"kernels ({ev.speed}); outputs {ev.outputs}",
    )


def _slow(ev: Evidence) -> Finding | None:
    # Only an explicit policy: the hot process's work (hits, misses, kernels built) is the
    # evidence; its compile time moves with the runner's load and the model's tracing cost.
    floor = ev.floor
    if floor is None or (ev.ratio is not None and ev.ratio >= floor):
        return None
    return (
        "no-gain",
        "slow",
        f"hot load hit ({ev.counters_shown}) but only {ev.speed}, below the --min-speedup "
        f"floor of {floor:g}x; outputs {ev.outputs}",
    )


# The order is the precedence: a cache problem (unsafe) outranks a compiler problem, which
# outranks a missing hot phase and every no-gain finding.
CHECKS = (
    _cold_failed,
    _hot_crashed,
    _hot_timed_out,
    _hot_failed,
    _hot_mismatch,
    _hot_recompiled,
    _compiler_mismatch,
    _hot_not_run,
    _refused,
    _autotuned,
    _missed,
    _rebuilt,
    _slow,
)


def notes(ev: Evidence) -> list[dict[str, Any]]:
    """Findings that do not change the verdict."""
    found: list[dict[str, Any]] = []
    if ev.hot.get("recompiles") and ev.cold.get("recompiles"):
        guard = str(ev.cold_result.get("recompile_guard") or "")
        found.append(
            causes.note(
                "model-recompiles",
                "the second input shape recompiles in the cold process too: a property of the "
                f"model and the dynamic mode, not of the cache ({guard or 'guard not recorded'})",
                guard=guard,
            )
        )
    unstable = [
        f"{name} phase: {result.get('self_stable_detail') or 'outputs changed'}"
        for name, result in (("cold", ev.cold_result), ("hot", ev.hot_result))
        if result.get("self_stable") is False
    ]
    if unstable:
        found.append(
            causes.note(
                "nondeterministic",
                "the compiled model is not bitwise stable against itself in one process ("
                + "; ".join(unstable)
                + "); hot and cold were compared within the dtype tolerance",
            )
        )
    if ev.cold.get("eager_reproducible") is False:
        text = "; ".join(ev.cold.get("eager_note") or []) or "eager changed between two runs"
        found.append(causes.note("eager-unreproducible", text))
    if ev.cold_result.get("random_ops"):
        found.append(
            causes.note(
                "random-ops",
                "the model draws random numbers (its eager output changes with the seed): "
                "compiled vs eager was not compared element-wise; hot vs cold was, from the "
                "same seed",
            )
        )
    if ev.hot.get("triton_uncounted"):
        found.append(
            causes.note(
                "triton-uncounted",
                f"hot phase: {ev.hot['triton_uncounted']}; a hot load that rebuilt Triton "
                "kernels cannot be told from a complete one here",
            )
        )
    drivers = ev.hot.get("triton_driver_builds") or []
    if drivers:
        found.append(
            causes.note(
                "triton-driver-built",
                f"the hot process built {len(drivers)} Triton C module(s) with the host's C "
                f"compiler ({', '.join(drivers[:5])}): TRITON_CACHE_DIR did not hold them; a "
                "cache that keeps the Triton directory carries them",
            )
        )
    for part in ev.why.get("uncacheable") or []:
        found.append(causes.note("uncacheable", key_explain.uncacheable_text(part)))
    if ev.cold_result.get("fp64_checked"):
        found.append(causes.note("fp64-accuracy", str(ev.cold_result["fp64_checked"])))
    return found


def explain(cold_result: dict[str, Any], hot_result: dict[str, Any]) -> dict[str, Any]:
    """Why the hot phase missed: differing key components, real misses, uncacheable parts.

    Empty when the hot phase recorded no cache lookups (an older worker, or nothing compiled).
    """
    if not (hot_result.get("keyinfo") or {}).get("lookups"):
        return {}
    return key_explain.explain(cold_result, hot_result)


def tracing_share(hot: dict[str, Any]) -> str:
    """What a hot compile that hit spent on Dynamo (tracing, guards), where that was most of it:
    no cache skips that work, so a large model gains far less than the kernels it loads."""
    tracing, total = hot.get("tracing_s"), hot.get("compile_s")
    if not tracing or not total or tracing * 2 < total:
        return ""
    return (
        f"; {tracing:.1f} s of its {total:.1f} s hot compile is Dynamo tracing and guards, "
        "which no cache skips"
    )


def _hit(ev: Evidence) -> Finding:
    """The finding when no check objects: a full hit, or a partial one (uncacheable parts).
    Safe at any speedup: what the hot process did decides; the speedup is information."""
    built = " nothing rebuilt," if "kernels_built" in ev.hot else ""
    slower = ev.speedup is not None and ev.speedup < 1
    # caching_precompile loads Dynamo's own output (bytecode, guards): its frame compile is
    # that load, not tracing
    dynamo = _hits_from(str(ev.combo.get("mechanism"))) == "dynamo"
    traced = tracing_share(ev.hot) if not dynamo else ""
    faster = f"{ev.speed} {'the speed of cold' if slower else 'faster'}{traced}"
    if ev.speedup is None:
        faster = ev.speed
    if ev.why.get("uncacheable"):
        parts = "; ".join(key_explain.uncacheable_text(p) for p in ev.why["uncacheable"])
        return (
            "safe",
            "partial-hit",
            f"hot load hit everything the cold phase cached ({ev.counters_shown}),{built} "
            f"outputs {ev.outputs}, {faster}; recompiled what torch never caches: {parts}",
        )
    return (
        "safe",
        "hit",
        f"hot load hit ({ev.counters_shown}),{built} outputs {ev.outputs}, {faster}",
    )


def shared_builds(cold: dict[str, Any], hot: dict[str, Any]) -> int:
    """Kernel builds either phase copied from the run's build memo: their compile times are
    not the phases' own, so no speedup is computed from them."""
    return int(cold.get("kernels_from_memo") or 0) + int(hot.get("kernels_from_memo") or 0)


def shown_speedup(ratio: float, floor: float | None) -> float:
    """`ratio` rounded to 2 decimals, never across `floor` (1.996 below a 2.0 floor is 1.99)."""
    value = round(ratio, 2)
    if floor is not None and (ratio < floor) != (value < floor):
        value = (math.floor if ratio < floor else math.ceil)(ratio * 100) / 100
    return value


def judge(
    combo: dict[str, Any],
    cold: dict[str, Any],
    hot: dict[str, Any],
    cold_result: dict[str, Any],
    hot_result: dict[str, Any],
    settings: dict[str, Any],
) -> dict[str, Any]:
    """Verdict, cause, one-line reason, notes and the numbers behind them (a results combo).

    The checks run in `CHECKS` order; the first that finds something decides."""
    ev = Evidence(combo, cold, hot, cold_result, hot_result, settings)
    if ev.hot_ran:
        ev.hits, ev.misses, ev.counters_shown = _hits(combo["mechanism"], hot)
        if cold.get("compile_s") and hot.get("compile_s") and not shared_builds(cold, hot):
            ev.ratio = cold["compile_s"] / max(hot["compile_s"], 1e-6)
            ev.speedup = shown_speedup(ev.ratio, ev.floor)
        artifact = artifact_evidence.judges(combo["mechanism"])
        ev.why = {} if artifact else explain(cold_result, hot_result)
        partial = bool(ev.why.get("uncacheable")) and not ev.why.get("misses")
        if partial and _hits_from(combo["mechanism"]) != "dynamo":
            ev.misses = 0  # only what the cold phase could not cache either: judged by the work
    finding: Finding = _hit(ev)
    for check in CHECKS:
        found = check(ev)
        if found is not None:
            finding = found
            break
    finding, workaround = workarounds.judged(combo, cold, hot, finding)
    verdict, cause, reason = finding
    extra: dict[str, Any] = {"workaround": workaround} if workaround else {}
    if cause == "miss" and ev.why:
        extra["explain"] = {"differs": ev.why["differs"], "misses": ev.why["misses"]}
    elif cause == "rebuilt":
        extra["explain"] = {
            "differs": ev.why.get("differs", []),
            "kernels": {
                "cpp": hot.get("kernels_built") or 0,
                "triton": hot.get("triton_kernels_built") or 0,
            },
        }
    return {
        "verdict": verdict,
        "cause": cause,
        "reason": reason,
        "notes": notes(ev),
        **extra,
        "speedup": ev.speedup,
        "cold": cold,
        "hot": hot,
        "max_abs_err": {
            "hot_vs_cold": (hot_result.get("vs_cold") or {}).get("max_abs_err"),
            "cold_vs_eager": (cold_result.get("vs_eager") or {}).get("max_abs_err"),
        },
        "tolerance": cold_result.get("tolerance") or hot_result.get("tolerance"),
        "hits": ev.hits,
        "misses": ev.misses,
    }


def not_judged(cause: str, reason: str) -> dict[str, Any]:
    """A results combo for a combination that never ran (skipped, or an error such as not-run)."""
    return {
        "verdict": causes.VERDICT_OF_CAUSE[cause],
        "cause": cause,
        "reason": reason,
        "notes": [],
        "speedup": None,
        "cold": None,
        "hot": None,
        "max_abs_err": {"hot_vs_cold": None, "cold_vs_eager": None},
        "tolerance": None,
        "hits": 0,
        "misses": 0,
    }
