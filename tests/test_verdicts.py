"""`verdicts.judge`: each check's verdict and cause, the notes, and reading version-1 documents."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ci_fxcache.results import reader
from ci_fxcache.verify import causes, verdicts

DATA = Path(__file__).parent / "data"
COMBO = {"dtype": "float16", "mechanism": "fxgraph", "device": "cpu"}
SETTINGS = {"compare": "bitwise", "min_speedup": 2.0}
HIT = {"fxgraph_cache_hit": 2, "aot_autograd_cache_hit": 1}
SAME = {"max_abs_err": 0.0, "bitwise": True, "close": True, "detail": ""}
OFF = {"max_abs_err": 1e-3, "bitwise": False, "close": True, "detail": ""}
WRONG = {"max_abs_err": 1.0, "bitwise": False, "close": False, "detail": "tensor 0 differs"}


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


def judge(
    cold: dict[str, Any] | None = None,
    hot: dict[str, Any] | None = None,
    cold_result: dict[str, Any] | None = None,
    hot_result: dict[str, Any] | None = None,
    **settings: Any,
) -> dict[str, Any]:
    return verdicts.judge(
        COMBO,
        cold or _phase(),
        hot or _phase(compile_s=1.0, counters=HIT),
        cold_result or {},
        {"vs_cold": SAME} if hot_result is None else hot_result,
        {**SETTINGS, **settings},
    )


@pytest.mark.parametrize(
    ("kwargs", "verdict", "cause"),
    [
        ({}, "safe", "hit"),
        ({"cold": _phase(status="error", error="boom")}, "error", "cold-error"),
        ({"hot": _phase(status="crash", signal="SIGSEGV")}, "unsafe", "crash"),
        ({"hot": _phase(status="timeout")}, "unsafe", "timeout"),
        ({"hot": _phase(status="error", error="boom")}, "unsafe", "hot-error"),
        ({"hot": _phase(status="not-run", error="cold only")}, "error", "not-run"),
        ({"hot_result": {"vs_cold": OFF}}, "unsafe", "hot-mismatch"),
        ({"hot_result": {"vs_cold": OFF}, "compare": "close"}, "safe", "hit"),
        ({"hot": _phase(compile_s=1.0, counters={"fxgraph_cache_miss": 2})}, "no-gain", "miss"),
        ({"hot": _phase(compile_s=1.0, counters=HIT, kernels_built=3)}, "no-gain", "rebuilt"),
        ({"hot": _phase(compile_s=6.0, counters=HIT)}, "no-gain", "slow"),
        ({"cold_result": {"vs_eager": WRONG}}, "error", "compiler-mismatch"),
        (
            {"hot": _phase(compile_s=1.0, counters=HIT, recompiles=1)},
            "unsafe",
            "recompile",
        ),
        (
            {
                "cold": _phase(recompiles=1),
                "hot": _phase(compile_s=1.0, counters=HIT, recompiles=1),
            },
            "safe",
            "hit",
        ),
    ],
)
def test_each_check_gives_its_verdict_and_cause(
    kwargs: dict[str, Any], verdict: str, cause: str
) -> None:
    judged = judge(**kwargs)
    assert (judged["verdict"], judged["cause"]) == (verdict, cause), judged["reason"]
    assert cause in causes.CAUSES[verdict]


def test_reasons_name_the_numbers() -> None:
    assert (
        "only 1.67x, below the --min-speedup floor of 2x"
        in judge(hot=_phase(compile_s=6.0, counters=HIT))["reason"]
    )
    assert "not a cache problem" in judge(cold=_phase(status="error", error="boom"))["reason"]
    assert "within tolerance" in judge(hot_result={"vs_cold": OFF}, compare="close")["reason"]


def test_a_cache_problem_outranks_a_compiler_problem() -> None:
    judged = judge(hot=_phase(status="crash", signal="SIGSEGV"), cold_result={"vs_eager": WRONG})
    assert (judged["verdict"], judged["cause"]) == ("unsafe", "crash")
    judged = judge(hot_result={"vs_cold": WRONG}, cold_result={"vs_eager": WRONG})
    assert judged["cause"] == "hot-mismatch"


def test_a_recompile_in_both_phases_is_a_note_with_the_guard() -> None:
    guard = "tensor 'x' size mismatch at index 0. expected 64, actual 40"
    judged = judge(
        cold=_phase(recompiles=1),
        hot=_phase(compile_s=1.0, counters=HIT, recompiles=1),
        cold_result={"recompile_guard": guard},
    )
    (note,) = judged["notes"]
    assert note["kind"] == "model-recompiles" and note["guard"] == guard


def test_nondeterministic_compiled_model_is_compared_within_tolerance() -> None:
    hot_result = {"vs_cold": OFF, "self_stable": False, "self_stable_detail": "max abs err 1e-7"}
    judged = judge(hot_result=hot_result)
    assert (judged["verdict"], judged["cause"]) == ("safe", "hit")
    assert [n["kind"] for n in judged["notes"]] == ["nondeterministic"]
    assert "within tolerance" in judged["reason"]
    # beyond the tolerance it is still wrong
    judged = judge(hot_result={**hot_result, "vs_cold": WRONG})
    assert (judged["verdict"], judged["cause"]) == ("unsafe", "hot-mismatch")


def test_random_and_fp64_notes() -> None:
    judged = judge(cold_result={"random_ops": True, "fp64_checked": "rmse 0.01 vs eager 0.02"})
    assert [n["kind"] for n in judged["notes"]] == ["random-ops", "fp64-accuracy"]


@pytest.mark.parametrize(
    ("fail_on", "failing"),
    [
        ("never", set()),
        ("unsafe", {"unsafe"}),
        ("error", {"unsafe", "error"}),
        ("no-gain", {"unsafe", "error", "no-gain"}),
    ],
)
def test_fail_on_levels(fail_on: str, failing: set[str]) -> None:
    combos = [{"verdict": v} for v in causes.VERDICTS]
    assert {c["verdict"] for c in causes.failing(combos, fail_on)} == failing


def test_version_1_documents_get_causes_and_version_2_requires_them() -> None:
    # A version-1 document as fxcache 0.1 wrote it (the H200 fixture before schema v2).
    doc = json.loads((DATA / "v1" / "results_h200_v1.json").read_text())
    assert doc["schema"] == "fxcache-results/1"
    loaded = reader.from_document(doc, "v1")
    combos = loaded.groups[0].shards[0].combos
    assert loaded.schema == "fxcache-results/2"
    for combo in combos:
        assert combo["cause"] in causes.CAUSES[combo["verdict"]], combo["id"]
        assert isinstance(combo["notes"], list)
    by_status = {(c["hot"] or {}).get("status"): c["cause"] for c in combos}
    assert by_status.get("crash") == "crash"
    # a version-2 document must carry a cause that fits its verdict
    v2 = {**loaded.doc, "combos": [{**combos[0], "cause": "no-device"}]}
    with pytest.raises(Exception, match=r"cause.*'no-device'"):
        reader.from_document(v2, "v2")


@pytest.mark.parametrize(
    ("combo", "cause"),
    [
        ({"verdict": "skipped", "reason": "no CUDA device"}, "no-device"),
        ({"verdict": "skipped", "reason": "Redis not configured"}, "unsupported"),
        ({"verdict": "safe"}, "hit"),
        ({"verdict": "no-gain", "hits": 0, "misses": 2, "hot": _phase()}, "miss"),
        ({"verdict": "no-gain", "hits": 2, "hot": _phase(kernels_built=4)}, "rebuilt"),
        ({"verdict": "no-gain", "hits": 2, "misses": 0, "hot": _phase()}, "slow"),
        ({"verdict": "error", "cold": _phase(status="error")}, "cold-error"),
        ({"verdict": "error", "cold": _phase(), "hot": _phase(status="not-run")}, "not-run"),
        ({"verdict": "unsafe", "hot": _phase(status="timeout")}, "timeout"),
        ({"verdict": "unsafe", "hot": _phase(status="error")}, "hot-error"),
        (
            {
                "verdict": "unsafe",
                "hot": _phase(recompiles=1),
                "max_abs_err": {"hot_vs_cold": 0.0, "cold_vs_eager": 0.0},
            },
            "recompile",
        ),
        (
            {
                "verdict": "unsafe",
                "hot": _phase(),
                "max_abs_err": {"hot_vs_cold": 0.5, "cold_vs_eager": 0.0},
            },
            "hot-mismatch",
        ),
    ],
)
def test_version_1_cause_mapping(combo: dict[str, Any], cause: str) -> None:
    upgraded = reader.upgrade_combo(combo)
    assert upgraded["cause"] == cause and upgraded["verdict"] == combo["verdict"]


def test_version_1_cold_differs_from_eager_becomes_compiler_mismatch() -> None:
    combo = {
        "verdict": "unsafe",
        "hot": _phase(),
        "tolerance": {"atol": 2.0**-10, "rtol": 1e-3},
        "max_abs_err": {"hot_vs_cold": 0.0, "cold_vs_eager": 0.0625},
    }
    upgraded = reader.upgrade_combo(combo)
    assert (upgraded["verdict"], upgraded["cause"]) == ("error", "compiler-mismatch")


@pytest.mark.parametrize(
    ("cause", "words"),
    [
        ("recompile", "recompiled on hot load"),
        ("hot-mismatch", "wrong values on hot load"),
        ("compiler-mismatch", "compiler, not cache"),
        ("miss", "the cache missed"),
    ],
)
def test_the_report_switches_on_cause_not_on_the_reasons_wording(cause: str, words: str) -> None:
    from ci_fxcache.report.model import cause_of, why_text

    combo = {
        "verdict": causes.VERDICT_OF_CAUSE[cause],
        "cause": cause,
        "reason": "outputs differ, missed, recompiled, from eager",  # every old keyword at once
        "hot": _phase(),
    }
    assert words in why_text(combo, cause_of(combo))


def test_a_cold_phase_unstable_against_itself_means_tolerance_not_unsafe() -> None:
    # hot was stable (it reran without a change), cold was not: the difference is the model's
    cold_result = {"self_stable": False, "self_stable_detail": "output 0 on the second shape"}
    judged = judge(hot_result={"vs_cold": OFF, "self_stable": True}, cold_result=cold_result)
    assert (judged["verdict"], judged["cause"]) == ("safe", "hit"), judged["reason"]
    (note,) = judged["notes"]
    assert note["kind"] == "nondeterministic" and "cold phase: output 0" in note["text"]
    # both self-stable: a hot/cold difference is unsafe
    judged = judge(hot_result={"vs_cold": OFF, "self_stable": True}, cold_result={})
    assert (judged["verdict"], judged["cause"]) == ("unsafe", "hot-mismatch")


@pytest.mark.parametrize("hot_s", [1.0, 6.0, 9.5, 14.0])
def test_a_complete_hit_is_safe_at_any_speedup_without_a_floor(hot_s: float) -> None:
    # 10x on an idle runner, 1.7x on a loaded one or for a model whose Dynamo tracing dominates
    judged = judge(hot=_phase(compile_s=hot_s, counters=HIT, kernels_built=0), min_speedup=None)
    assert (judged["verdict"], judged["cause"]) == ("safe", "hit"), judged["reason"]
    assert judged["speedup"] == round(10.0 / hot_s, 2)
    assert f"{judged['speedup']}x" in judged["reason"] and "nothing rebuilt" in judged["reason"]
    # what the hot process did still decides: a miss or a rebuild is no-gain at any speed
    missed = _phase(compile_s=hot_s, counters={"fxgraph_cache_miss": 2})
    assert judge(hot=missed, min_speedup=None)["cause"] == "miss"
    rebuilt = _phase(compile_s=hot_s, counters=HIT, kernels_built=4)
    assert judge(hot=rebuilt, min_speedup=None)["cause"] == "rebuilt"


def test_a_floor_is_an_explicit_policy_and_never_rounded_across() -> None:
    assert judge(hot=_phase(compile_s=6.0, counters=HIT))["cause"] == "slow"  # floor 2.0 set
    # 1.996x is below a 2.0 floor: no-gain, and never recorded or shown as 2.0x
    judged = judge(cold=_phase(compile_s=1.996), hot=_phase(compile_s=1.0, counters=HIT))
    assert (judged["verdict"], judged["cause"]) == ("no-gain", "slow")
    assert judged["speedup"] == 1.99
    assert "only 1.99x, below the --min-speedup floor of 2x" in judged["reason"]
    assert verdicts.shown_speedup(1.999, 2.0) == 1.99 and verdicts.shown_speedup(2.0, 2.0) == 2.0
    assert verdicts.shown_speedup(1.996, None) == 2.0  # no floor: plain rounding


def test_a_zero_floor_asks_for_nothing_even_when_the_speedup_is_unmeasured() -> None:
    slower = judge(hot=_phase(compile_s=30.0, counters=HIT, kernels_built=0), min_speedup=0.0)
    assert (slower["verdict"], slower["cause"], slower["speedup"]) == ("safe", "hit", 0.33)
    # kernels copied from the run's build memo: no speedup is computed
    memo = _phase(compile_s=1.0, counters=HIT, kernels_from_memo=2)
    judged = judge(hot=memo, min_speedup=0.0)
    assert (judged["verdict"], judged["cause"], judged["speedup"]) == ("safe", "hit", None)
    # the same unmeasured speedup under a real floor cannot be shown to reach it
    assert judge(hot=memo, min_speedup=0.5)["cause"] == "slow"


def test_a_hit_whose_hot_compile_is_mostly_dynamo_tracing_says_so() -> None:
    hot = _phase(compile_s=4.0, counters=HIT, tracing_s=3.1)
    judged = judge(hot=hot, min_speedup=None)
    assert (judged["verdict"], judged["cause"]) == ("safe", "hit")
    assert "3.1 s of its 4.0 s hot compile is Dynamo tracing and guards" in judged["reason"]
    # caching_precompile's frame compile loads Dynamo's package: not tracing
    precompiled = verdicts.judge(
        {**COMBO, "mechanism": "precompile"},
        _phase(),
        _phase(compile_s=4.0, counters={"dynamo_cache_hit": 1}, tracing_s=3.1),
        {},
        {"vs_cold": SAME},
        {**SETTINGS, "min_speedup": None},
    )
    assert precompiled["cause"] == "hit" and "tracing" not in precompiled["reason"]
    # where tracing is the smaller part, nothing is said about it
    quiet = judge(hot=_phase(compile_s=4.0, counters=HIT, tracing_s=1.0), min_speedup=None)
    assert "tracing" not in quiet["reason"]
