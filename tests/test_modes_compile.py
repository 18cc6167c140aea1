"""Compile modes and compile options with real torch compiles on the CPU, fresh processes:
max-autotune on a tiny MLP whose factory also names torch.compile options (fullgraph, an
Inductor option) is `safe`, and the mode is in the results, the text line and the report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import ROOT, TORCH_PYTHON, RunFxcache

pytestmark = pytest.mark.slow

WORKLOAD = "tests.workloads.modes:tiny_mlp_options"


def test_max_autotune_with_compile_options_is_safe_and_named(
    run_fxcache: RunFxcache, tmp_path: Path
) -> None:
    out = tmp_path / "results.json"
    proc = run_fxcache(
        "verify", "--python", TORCH_PYTHON, "--workloads", WORKLOAD, "--dtypes", "float32",
        "--dynamic", "false", "--mechanisms", "fxgraph", "--training", "false",
        "--modes", "max-autotune,reduce-overhead", "--cache-dir", str(tmp_path / "cache"),
        "--json", str(out),
        env={"TORCHINDUCTOR_COMPILE_THREADS": "1"}, timeout=900, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    from tests.test_results_schema import validate

    validate(doc)
    by_mode = {c["mode"]: c for c in doc["combos"]}
    tuned = by_mode["max-autotune"]
    assert (tuned["verdict"], tuned["cause"]) == ("safe", "hit"), tuned["reason"]
    assert tuned["id"].endswith("-infer-max-autotune")
    assert doc["matrix"]["modes"] == ["max-autotune", "reduce-overhead"]
    skipped = by_mode["reduce-overhead"]
    assert (skipped["verdict"], skipped["cause"]) == ("skipped", "unsupported")
    assert "CUDA graphs" in skipped["reason"]
    assert "fxgraph infer max-autotune safe" in " ".join(proc.stdout.split())
    report = run_fxcache("report", str(out), "--format", "md")
    assert report.returncode == 0 and "max-autotune" in report.stdout


def test_autotuning_again_in_the_hot_process_is_no_gain_naming_it(
    run_fxcache: RunFxcache, tmp_path: Path
) -> None:
    """Fault injection: the hot process removes the tuned choices from Inductor's autotune
    cache before it compiles (tests/workloads/modes.py), so torch really benchmarks again."""
    out = tmp_path / "results.json"
    proc = run_fxcache(
        "verify", "--python", TORCH_PYTHON, "--workloads",
        "tests.workloads.modes:frozen_mlp_forget_tuning", "--dtypes", "float32",
        "--dynamic", "false", "--mechanisms", "fxgraph", "--training", "false",
        "--modes", "max-autotune", "--cache-dir", str(tmp_path / "cache"), "--json", str(out),
        env={"TORCHINDUCTOR_COMPILE_THREADS": "1", "FXCACHE_TEST_FAULT": "forget-tuning"},
        timeout=900, cwd=ROOT,
    )  # fmt: skip
    doc = json.loads(out.read_text())
    (combo,) = doc["combos"]
    if not combo["cold"].get("autotune"):
        pytest.skip("the cold phase benchmarked nothing: no C++ GEMM template for this CPU")
    assert (combo["verdict"], combo["cause"]) == ("no-gain", "autotuned"), combo["reason"]
    assert combo["reason"].startswith("autotuning ran again in the hot process: ")
    tuned = combo["hot"]["autotune"]
    assert tuned["counters"].get("select_algorithm_autotune", 0) > 0, tuned
    report = run_fxcache("report", str(out), "--format", "md").stdout
    assert "autotuning ran again on hot load" in report
    assert proc.returncode == 0, proc.stderr  # no-gain does not fail the job by default
