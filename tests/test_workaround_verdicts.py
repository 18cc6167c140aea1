"""The verdicts and recommendations for `aot`'s two known upstream failures, from evidence as
the worker records it (tests/test_artifact_workarounds.py runs them on real torch): a workaround
is recommended only where the run verified it, and a workaround that computed wrong values is
`unsafe`, whatever the upstream issue."""

from __future__ import annotations

from typing import Any

import pytest

from ci_fxcache.report import known_issues, recommendations
from ci_fxcache.verify import verdicts, workarounds
from tests.test_results_schema import example, validate

SETTINGS = {"compare": "bitwise", "min_speedup": None}
SAME = {"max_abs_err": 0.0, "bitwise": True, "close": True, "detail": ""}
WRONG = {"max_abs_err": 1.0, "bitwise": False, "close": False, "detail": "output 0 differs"}
GUARD = (
    "RuntimeError: the loaded artifact's guard failed: _has_dynamo_dim_marking is present on "
    "runtime tensor but was absent at compile time"
)
RESTART = "aot_compile raised TensorifyScalarRestartAnalysis"
ISSUES = {i.id: i for i in known_issues.load_builtin()}


def _phase(**kw: Any) -> dict[str, Any]:
    return {
        "status": "ok",
        "compile_s": 9.0,
        "wall_s": 12.0,
        "counters": {},
        "returncode": 0,
        "signal": None,
        "log_tail": "",
        **kw,
    }


def _artifact(**kw: Any) -> dict[str, Any]:
    return {"mechanism": "aot", "file": "aot.bin", "bytes": 30000, "loaded": True, **kw}


def _judge(
    dynamic: str, cold: dict[str, Any], hot: dict[str, Any], vs_cold: dict[str, Any] = SAME
) -> dict[str, Any]:
    combo: dict[str, Any] = {"id": f"mlp-cpu-float32-{dynamic}-aot-infer", "workload": "mlp"}
    combo.update(device="cpu", dtype="float32", dynamic=dynamic, mechanism="aot", training=False)
    judged = verdicts.judge(combo, cold, hot, {}, {"vs_cold": vs_cold}, SETTINGS)
    out = {**combo, **judged}
    validate({**example(), "combos": [out]})
    return out


def _marked(check: dict[str, Any], vs_cold: dict[str, Any] = SAME) -> dict[str, Any]:
    cold = _phase(artifact=_artifact(compiled_graphs=1))
    hot = _phase(artifact=_artifact(refused=GUARD, compiled_graphs=1, workaround=check))
    return _judge("mark", cold, hot, vs_cold)


def _advice(combo: dict[str, Any]) -> str:
    return recommendations.advice(combo, combo["cause"], None, "")


UNMARKED_OK = {"name": "unmarked-inputs", "close": True, "max_abs_err": 4e-6, "detail": ""}
UNMARKED_WRONG = {"name": "unmarked-inputs", "close": False, "max_abs_err": 28.4}


def test_a_guard_refusal_with_a_correct_unmarked_call_is_refused_and_recommended() -> None:
    combo = _marked(UNMARKED_OK)
    assert (combo["verdict"], combo["cause"]) == ("no-gain", "refused")
    assert combo["reason"].endswith(
        "the loaded artifact works when called with unmarked inputs (the second input shape, "
        "within the float32 tolerance of eager): verified on this runner"
    )
    assert combo["workaround"] == {
        "name": "unmarked-inputs",
        "issue": "aot-mark-dynamic-guard",
        "verified": True,
        "how": combo["workaround"]["how"],
    }
    assert _advice(combo) == f"{workarounds.UNMARKED.advice}: verified on this runner"
    assert ISSUES["aot-mark-dynamic-guard"].applies(combo, "2.15.0+cu132")


def test_an_unmarked_call_with_wrong_values_is_unsafe_and_never_recommended() -> None:
    """Fault injection on the rule itself: without it, this evidence reads no-gain / refused
    (the fallback compile matched cold)."""
    combo = _marked({**UNMARKED_WRONG, "detail": "output 0 differs"})
    assert (combo["verdict"], combo["cause"]) == ("unsafe", "hot-mismatch"), combo["reason"]
    assert "computed values that differ from eager beyond the float32 tolerance" in combo["reason"]
    assert "max abs err 28.4" in combo["reason"]
    assert combo["workaround"]["verified"] is False
    assert "verified on this runner" not in combo["reason"]
    assert "unmarked" not in _advice(combo)
    # the reason names torch's refusal: the upstream issue is still shown beside the row
    assert ISSUES["aot-mark-dynamic-guard"].applies(combo, "2.13.0+cpu")


def test_an_unmarked_call_that_raises_too_is_not_recommended() -> None:
    combo = _marked({"name": "unmarked-inputs", "error": "RuntimeError: GuardManager check"})
    assert (combo["verdict"], combo["cause"]) == ("no-gain", "refused")
    assert combo["reason"].endswith("no workaround verified")
    assert combo["workaround"]["verified"] is False
    assert _advice(combo) == recommendations.NOTHING_SAFE


def test_a_correct_unmarked_call_is_not_recommended_beside_a_wrong_fallback() -> None:
    combo = _marked(UNMARKED_OK, vs_cold=WRONG)
    assert (combo["verdict"], combo["cause"]) == ("unsafe", "hot-mismatch")
    assert combo["workaround"]["verified"] is False
    assert "verified on this runner" not in _advice(combo)


def _restarted(hot: dict[str, Any], vs_cold: dict[str, Any] = SAME) -> dict[str, Any]:
    check = {"name": "specialize-float", "why": RESTART}
    cold = _phase(artifact=_artifact(compiled_graphs=1, workaround=check))
    return _judge("true", cold, hot, vs_cold)


def test_a_float_restart_compiled_with_specialize_float_and_hot_loaded_is_recommended() -> None:
    combo = _restarted(_phase(artifact=_artifact(compiled_graphs=0), kernels_built=8))
    assert (combo["verdict"], combo["cause"]) == ("error", "cold-error")
    assert combo["reason"].startswith(f"cold compile failed ({RESTART}, a known upstream issue")
    assert "gave no-gain / rebuilt" in combo["reason"]
    assert combo["reason"].endswith("verified on this runner")
    assert combo["workaround"]["verified"] is True
    assert _advice(combo) == f"{workarounds.SPECIALIZE_FLOAT.advice}: verified on this runner"
    assert ISSUES["aot-compile-float-restart"].applies(combo, "2.15.0+cu132")


@pytest.mark.parametrize(
    ("hot", "vs_cold", "verdict", "cause"),
    [
        # the workaround's artifact computes other values than cold: unsafe stays unsafe
        (_phase(artifact=_artifact(compiled_graphs=0)), WRONG, "unsafe", "hot-mismatch"),
        # torch refused the workaround's artifact: it did not hot-load
        (
            _phase(artifact=_artifact(loaded=False, refused="UnpicklingError: truncated")),
            SAME,
            "error",
            "cold-error",
        ),
    ],
)
def test_a_float_restart_workaround_that_did_not_hot_load_correctly_is_not_recommended(
    hot: dict[str, Any], vs_cold: dict[str, Any], verdict: str, cause: str
) -> None:
    combo = _restarted(hot, vs_cold)
    assert (combo["verdict"], combo["cause"]) == (verdict, cause), combo["reason"]
    assert combo["workaround"]["verified"] is False
    assert "specialize_float" in combo["reason"]
    assert "verified on this runner" not in combo["reason"]
    assert "specialize_float" not in _advice(combo)


def test_a_documents_own_claim_of_an_unknown_workaround_is_not_rendered() -> None:
    """The advice's words are the report's: a document cannot put its own text there."""
    combo = _marked(UNMARKED_OK)
    combo["workaround"] = {**combo["workaround"], "name": "<b>trust me</b>"}
    assert _advice(combo) == recommendations.NOTHING_SAFE


def test_without_a_workaround_the_verdicts_are_unchanged() -> None:
    cold = _phase(artifact=_artifact(compiled_graphs=1))
    hot = _phase(artifact=_artifact(refused="UnpicklingError: truncated", loaded=False))
    combo = _judge("false", cold, hot)
    assert (combo["verdict"], combo["cause"]) == ("no-gain", "refused")
    assert "workaround" not in combo
    assert not ISSUES["aot-mark-dynamic-guard"].applies(combo, "2.15.0")


def test_a_carried_verdict_says_which_run_verified_its_workaround() -> None:
    """A hot-only run carries a no-gain verdict from the run that built the cache: the
    recommendation says that run verified it, not this one."""
    combo = _marked(UNMARKED_OK)
    combo["notes"] = [{"kind": "carried", "text": "not re-checked", "judged_at": "2026-12-05"}]
    assert _advice(combo) == (
        f"{workarounds.UNMARKED.advice}: verified when this cache was built (2026-12-05), "
        "not re-checked this run"
    )
