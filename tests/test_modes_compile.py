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
