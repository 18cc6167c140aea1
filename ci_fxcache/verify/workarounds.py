"""Known upstream failures of torch's artifact APIs, and the verdict when the run checked their
workaround (the worker's `artifact.workaround`, ci_fxcache/worker/workarounds.py).

A workaround is recommended only where this run verified it; a workaround that computed wrong
values makes the combination `unsafe`, never hidden behind the upstream issue. docs/verify.md
says why each failure gets the verdict it gets.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ci_fxcache.verify import verdict_kinds

Finding = tuple[str, str, str]  # (verdict, cause, reason), as verdicts.Finding
VERIFIED = "verified on this runner"


@dataclass(frozen=True)
class Workaround:
    """One known failure's workaround: the worker's name for it, the known issue it answers
    (report/known_issues.yaml) and what a user does."""

    name: str
    issue: str
    advice: str


SPECIALIZE_FLOAT = Workaround(
    "specialize-float",
    "aot-compile-float-restart",
    "compile with torch._dynamo.config.specialize_float = True (float constants such as "
    "LayerNorm's eps become constants of the graph)",
)
UNMARKED = Workaround(
    "unmarked-inputs",
    "aot-mark-dynamic-guard",
    "the loaded artifact works when called with unmarked inputs (no torch._dynamo.mark_dynamic; "
    "its dynamic dim still serves other sizes)",
)
BY_NAME = {w.name: w for w in (SPECIALIZE_FLOAT, UNMARKED)}


def _check(phase: dict[str, Any] | None) -> dict[str, Any]:
    workaround = ((phase or {}).get("artifact") or {}).get("workaround")
    return workaround if isinstance(workaround, dict) else {}


def judged(
    combo: dict[str, Any], cold: dict[str, Any], hot: dict[str, Any], finding: Finding
) -> tuple[Finding, dict[str, Any] | None]:
    """The finding with what the run learnt of a known failure's workaround, and the
    results combo's `workaround` record (None where no workaround was tried)."""
    if _check(cold).get("name") == SPECIALIZE_FLOAT.name:
        return _specialized(cold, finding)
    if _check(hot).get("name") == UNMARKED.name:
        refused = str((hot.get("artifact") or {}).get("refused") or "its guard refused")
        return _unmarked(combo, _check(hot), refused, finding)
    return finding, None


def _record(workaround: Workaround, verified: bool, how: str) -> dict[str, Any]:
    return {
        "name": workaround.name,
        "issue": workaround.issue,
        "verified": verified,
        "how": how[:500],
    }


def _specialized(cold: dict[str, Any], finding: Finding) -> tuple[Finding, dict[str, Any]]:
    """The cold phase compiled with `specialize_float` after aot_compile's known failure: the
    combination as configured is a compile error (not a cache problem), unless the compile
    with the workaround gave a wrong result (unsafe stays unsafe) or differs from eager."""
    verdict, cause, reason = finding
    why = str(_check(cold).get("why") or "aot_compile raised TensorifyScalarRestartAnalysis")
    applied = f"cold compiled with torch._dynamo.config.specialize_float = True after {why}"
    if verdict == "unsafe" or cause == "compiler-mismatch":
        return (verdict, cause, f"{reason} ({applied})"), _record(
            SPECIALIZE_FLOAT, False, f"{verdict}: {reason}"
        )
    hot_loaded = verdict in verdict_kinds.loaded() and cause != "refused"
    outcome = f"{verdict} / {cause}: {reason}"
    said = (
        f"with it, the compile and its hot load gave {outcome}: {VERIFIED}"
        if hot_loaded
        else f"with it: {outcome} (the workaround is not verified)"
    )
    return (
        "error",
        "cold-error",
        f"cold compile failed ({why}, a known upstream issue: aot_compile does not restart its "
        f"analysis as torch.compile does); not a cache problem; workaround: "
        f"torch._dynamo.config.specialize_float = True, {said}",
    ), _record(SPECIALIZE_FLOAT, hot_loaded, outcome)


def _unmarked(
    combo: dict[str, Any], check: dict[str, Any], refused: str, finding: Finding
) -> tuple[Finding, dict[str, Any]]:
    """The hot phase's loaded artifact refused marked inputs (`refused`: torch's words) and
    was then called unmarked: a wrong result there is unsafe (its reason names the refusal, so
    the known issue stays matched); a correct one is the verified workaround."""
    verdict, cause, reason = finding
    tolerance = f"{combo['dtype']} tolerance"
    if check.get("error"):
        how = f"called with unmarked inputs the loaded artifact failed too ({check['error']})"
        return (verdict, cause, f"{reason}; {how}: no workaround verified"), _record(
            UNMARKED, False, how
        )
    if not check.get("close"):
        detail = f"; {check['detail']}" if check.get("detail") else ""
        how = (
            f"the loaded artifact, refused for marked inputs ({refused}) and called with "
            "unmarked inputs (the second input shape), computed values that differ from eager "
            f"beyond the {tolerance} (max abs err {check.get('max_abs_err')}{detail})"
        )
        if verdict == "unsafe":
            return (verdict, cause, f"{reason}; also {how}"), _record(UNMARKED, False, how)
        return ("unsafe", "hot-mismatch", how), _record(UNMARKED, False, how)
    how = (
        "the loaded artifact works when called with unmarked inputs (the second input shape, "
        f"within the {tolerance} of eager)"
    )
    verified = verdict != "unsafe"
    said = f"{how}: {VERIFIED}" if verified else how
    return (verdict, cause, f"{reason}; {said}"), _record(UNMARKED, verified, how)


def verified(combo: dict[str, Any]) -> Workaround | None:
    """The workaround this run verified for `combo` (its results `workaround`), or None."""
    record = combo.get("workaround")
    if not isinstance(record, dict) or record.get("verified") is not True:
        return None
    return BY_NAME.get(str(record.get("name")))
