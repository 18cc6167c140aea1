"""The verdicts of the artifact mechanisms (`aot`, `precompile-api`) from their evidence: the
same checks as the caches, with the artifact's load in place of the cache counters."""

from __future__ import annotations

from typing import Any

import pytest

from ci_fxcache.verify import causes, verdicts
from tests.test_results_schema import validate

SETTINGS = {"compare": "bitwise", "min_speedup": 2.0}
SAME = {"max_abs_err": 0.0, "bitwise": True, "close": True, "detail": ""}
WRONG = {"max_abs_err": 1.0, "bitwise": False, "close": False, "detail": "output 0 differs"}
LOADED = {"mechanism": "aot", "file": "aot.bin", "bytes": 42552, "loaded": True}
LOADED.update(traced_graphs=0, compiled_graphs=0)
REFUSED = {"mechanism": "aot", "file": "aot.bin", "bytes": 21276, "loaded": False}
REFUSED.update(refused="UnpicklingError: pickle data was truncated", compiled_graphs=1)


def _phase(**kw: Any) -> dict[str, Any]:
    return {
        "status": "ok",
        "compile_s": 10.0,
        "wall_s": 12.0,
        "counters": {},
        "returncode": 0,
        "signal": None,
        "log_tail": "",
        **kw,
    }


def judge(mechanism: str, hot: dict[str, Any], vs_cold: dict[str, Any] = SAME) -> dict[str, Any]:
    combo = {"dtype": "float32", "mechanism": mechanism, "device": "cpu"}
    cold = _phase(artifact={"mechanism": mechanism, "file": "aot.bin", "compiled_graphs": 1})
    return verdicts.judge(combo, cold, hot, {}, {"vs_cold": vs_cold}, SETTINGS)


@pytest.mark.parametrize("mechanism", ["aot", "precompile-api"])
@pytest.mark.parametrize(
    ("hot", "vs_cold", "verdict", "cause", "reason"),
    [
        (_phase(compile_s=1.0, artifact=LOADED), SAME, "safe", "hit", "hot load hit (aot.bin "),
        (
            _phase(compile_s=9.0, artifact=LOADED, kernels_built=12),
            SAME,
            "no-gain",
            "rebuilt",
            "counters report a hit (aot.bin loaded, 42.6 kB) but the hot process rebuilt 12 C++",
        ),
        (
            _phase(compile_s=9.0, artifact=REFUSED),
            SAME,
            "no-gain",
            "refused",
            "torch refused the artifact (UnpicklingError: pickle data was truncated); the hot "
            "process compiled instead, outputs bitwise equal",
        ),
        (
            _phase(compile_s=9.0, artifact={**LOADED, "traced_graphs": 1, "compiled_graphs": 1}),
            SAME,
            "no-gain",
            "miss",
            "hot load missed (aot.bin loaded, 42.6 kB; the hot process compiled 1 graph again)",
        ),
        (
            _phase(compile_s=1.0, artifact=LOADED),
            WRONG,
            "unsafe",
            "hot-mismatch",
            "hot outputs differ from the cold compile",
        ),
        # a refused artifact whose replacement computes other values is still caught
        (
            _phase(compile_s=9.0, artifact=REFUSED),
            WRONG,
            "unsafe",
            "hot-mismatch",
            "hot outputs differ",
        ),
        (
            _phase(
                status="error", error="RuntimeError: GuardManager check failed", artifact=LOADED
            ),
            SAME,
            "unsafe",
            "hot-error",
            "hot phase failed (RuntimeError: GuardManager check failed)",
        ),
    ],
)
def test_the_artifact_load_decides_like_the_cache_counters(
    mechanism: str,
    hot: dict[str, Any],
    vs_cold: dict[str, Any],
    verdict: str,
    cause: str,
    reason: str,
) -> None:
    hot = {**hot, "artifact": {**hot["artifact"], "mechanism": mechanism}}
    judged = judge(mechanism, hot, vs_cold)
    assert (judged["verdict"], judged["cause"]) == (verdict, cause), judged["reason"]
    assert judged["reason"].startswith(reason), judged["reason"]
    assert cause in causes.CAUSES[verdict]
    assert "explain" not in judged or cause == "rebuilt"  # no cache keys to explain
    doc_combo = {
        "id": f"sin_matmul-cpu-float32-static-{mechanism}-train",
        "workload": "sin_matmul",
        "device": "cpu",
        "dtype": "float32",
        "dynamic": "false",
        "mechanism": mechanism,
        "training": True,
        **judged,
    }
    validate(_document([doc_combo]))


def test_a_refusal_is_never_unsafe_and_fails_only_no_gain() -> None:
    judged = judge("aot", _phase(compile_s=9.0, artifact=REFUSED))
    assert causes.failing([judged], "unsafe") == []
    assert causes.failing([judged], "no-gain") == [judged]


def _document(combos: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "schema": "fxcache-results/2",
        "fxcache_version": "0.1.0",
        "created_at": "2026-12-02T10:00:00Z",
        "report_id": "fxcache",
        "runner": {"name": "r", "os": "Linux"},
        "fingerprint": None,
        "scope_key": None,
        "cache": None,
        "settings": {
            "phase": "both",
            "min_speedup": 2.0,
            "compare": "bitwise",
            "fail_on": "unsafe",
            "timeout_s": 600,
        },
        "matrix": {
            "devices": ["cpu"],
            "dtypes": ["float32"],
            "dynamic": ["false"],
            "mechanisms": ["aot", "precompile-api"],
            "training": [True],
            "workloads": ["sin_matmul"],
        },
        "combos": combos,
        "summary": causes.summary(combos),
    }
