"""Known upstream failures of `aot` (torch 2.13.0 and 2.15.0), named and answered with a
workaround the run verified, end to end on real torch processes:

- `dynamic: true` on a module with float constants (mlp's LayerNorm): `aot_compile` raises
  TensorifyScalarRestartAnalysis; the cold phase retries with `specialize_float`, the hot phase
  loads that artifact, and the report recommends the setting as verified.
- `dynamic: mark`: the loaded artifact's guard refuses marked inputs; the hot phase falls back
  to a compile (`no-gain` / `refused`) and calls the loaded artifact with unmarked inputs of
  the other shape against eager: verified, recommended.
- Fault injection: the artifact tampered so that its unmarked call computes other values; the
  workaround is not recommended and the combination is `unsafe`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from ci_fxcache import report as reports
from tests.conftest import TORCH2_VENV, TORCH2_VERSION, TORCH_PYTHON, RunFxcache, torch2_python
from tests.faults import tamper_sine
from tests.test_verify import _run_once, _shared, load, verify

pytestmark = pytest.mark.slow

AXES = ("--dtypes", "float32", "--training", "false", "--mechanisms", "aot")
RESTART = "mlp-cpu-float32-dynamic-aot-infer"
MARKED = ("mlp-cpu-float32-mark-aot-infer", "sin_matmul-cpu-float32-mark-aot-infer")
VERIFIED = "verified on this runner"

WorkaroundRun = tuple[subprocess.CompletedProcess[str], Path, str]


def _python(which: str) -> str:
    """torch 2.13.0 (this interpreter) or 2.15.0; 2.15.0 is skipped, with the reason, where no
    such interpreter was set up."""
    if which == "2.13.0":
        return TORCH_PYTHON
    if not os.environ.get("FXCACHE_TEST_TORCH2_PYTHON") and not TORCH2_VENV.exists():
        pytest.skip(
            f"no torch {TORCH2_VERSION} interpreter: set FXCACHE_TEST_TORCH2_PYTHON (or build "
            ".venv-torch2.15 with the README's test command)"
        )
    return torch2_python()


@pytest.fixture(scope="module", params=["2.13.0", TORCH2_VERSION])
def workaround_run(request: pytest.FixtureRequest, tmp_path_factory: Any) -> WorkaroundRun:
    """mlp and sin_matmul, aot, dynamic true and mark, inference: cold + hot, once per torch."""
    python = _python(str(request.param))
    root = _shared(tmp_path_factory, f"verify-aot-workarounds-{request.param}")
    proc = _run_once(
        root,
        *AXES,
        *("--workloads", "mlp,sin_matmul", "--dynamic", "true,mark"),
        *("--cache-dir", str(root / "cache"), "--json", str(root / "results.json")),
        python=python,
    )
    return proc, root, python


def _combo(doc: dict[str, Any], combo_id: str) -> dict[str, Any]:
    (combo,) = [c for c in doc["combos"] if c["id"] == combo_id]
    return combo


def _rows(results: Path) -> dict[str, Any]:
    """The report's rows by combination id (their known issues and advice)."""
    _, built = reports.build(str(results))
    return {str(r.combo["id"]): r for s in built.sections for r in s.rows}


def _doc(run: WorkaroundRun) -> dict[str, Any]:
    proc, root, _ = run
    assert (root / "results.json").exists(), proc.stdout + proc.stderr
    return dict(load(root / "results.json"))


def test_aot_compile_float_restart_is_named_and_specialize_float_verified(
    workaround_run: WorkaroundRun,
) -> None:
    doc = _doc(workaround_run)
    combo = _combo(doc, RESTART)
    cold_artifact = combo["cold"]["artifact"]
    if "workaround" not in cold_artifact and combo["cold"]["status"] == "ok":
        pytest.skip("this torch's aot_compile no longer raises TensorifyScalarRestartAnalysis")
    assert cold_artifact["workaround"]["name"] == "specialize-float"
    assert "TensorifyScalarRestartAnalysis" in cold_artifact["workaround"]["why"]
    # The combination as configured is a compile failure, not a cache problem ...
    assert (combo["verdict"], combo["cause"]) == ("error", "cold-error"), combo["reason"]
    assert "TensorifyScalarRestartAnalysis" in combo["reason"]
    # ... and the workaround's artifact compiled, loaded in a fresh process, computed cold's bits.
    assert combo["hot"]["artifact"]["loaded"] is True
    assert "refused" not in combo["hot"]["artifact"]
    assert combo["max_abs_err"]["hot_vs_cold"] == 0.0
    assert combo["cold"]["pid"] != combo["hot"]["pid"]
    assert combo["workaround"]["verified"] is True, combo["workaround"]
    assert combo["reason"].endswith(VERIFIED), combo["reason"]
    row = _rows(workaround_run[1] / "results.json")[RESTART]
    assert "aot-compile-float-restart" in [i.id for i in row.issues]
    assert "torch._dynamo.config.specialize_float = True" in row.advice
    assert row.advice.endswith(VERIFIED), row.advice


@pytest.mark.parametrize("combo_id", MARKED)
def test_aot_mark_guard_is_a_refusal_named_with_the_unmarked_call_verified(
    workaround_run: WorkaroundRun, combo_id: str
) -> None:
    proc, root, _ = workaround_run
    combo = _combo(_doc(workaround_run), combo_id)
    hot = combo["hot"]["artifact"]
    if "workaround" not in hot and combo["hot"]["status"] == "ok":
        pytest.skip("this torch's loaded aot artifact accepts inputs marked with mark_dynamic")
    # torch's guard refused the artifact: loud, before computing anything; the phase compiled.
    assert (combo["verdict"], combo["cause"]) == ("no-gain", "refused"), combo["reason"]
    assert "_has_dynamo_dim_marking is present on runtime tensor" in hot["refused"]
    assert combo["max_abs_err"]["hot_vs_cold"] == 0.0  # the fallback matches cold
    check = hot["workaround"]
    assert check["name"] == "unmarked-inputs" and check["close"] is True, check
    assert "works when called with unmarked inputs" in combo["reason"]
    assert combo["reason"].endswith(VERIFIED), combo["reason"]
    assert combo["workaround"]["verified"] is True
    row = _rows(root / "results.json")[combo_id]
    assert "aot-mark-dynamic-guard" in [i.id for i in row.issues]
    assert row.advice.startswith("the loaded artifact works when called with unmarked inputs")
    assert row.advice.endswith(VERIFIED), row.advice
    assert combo_id not in proc.stderr  # refused is no-gain: it fails no --fail-on unsafe job


def test_an_unmarked_call_that_computes_other_values_is_unsafe_and_not_recommended(
    workaround_run: WorkaroundRun, run_fxcache: RunFxcache, tmp_path: Path
) -> None:
    """The sine kernel of the marked sin_matmul artifact turned into a cosine: its guard still
    refuses marked inputs, and the unmarked call now computes other values than eager."""
    _, root, python = workaround_run
    combo_id = MARKED[1]
    shutil.copytree(root / "cache" / combo_id, tmp_path / "cache" / combo_id)
    (tmp_path / "cache" / combo_id / "verdict.json").unlink(missing_ok=True)
    assert tamper_sine(tmp_path / "cache" / combo_id / "aot.bin") >= 1
    out = tmp_path / "hot.json"
    proc = verify(
        run_fxcache,
        *AXES,
        *("--workloads", "sin_matmul", "--dynamic", "mark", "--phase", "hot"),
        *("--cache-dir", str(tmp_path / "cache"), "--json", str(out)),
        python=python,
    )
    (combo,) = load(out)["combos"]
    check = combo["hot"]["artifact"].get("workaround")
    if check is None and combo["hot"]["status"] == "ok":
        pytest.skip("this torch's loaded aot artifact accepts inputs marked with mark_dynamic")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert combo["verdict"] == "unsafe", combo["reason"]
    assert check["close"] is False and check["max_abs_err"] > 0.1, check
    assert combo["workaround"]["verified"] is False
    assert "called with unmarked inputs" in combo["reason"]
    assert VERIFIED not in combo["reason"]
    row = _rows(out)[combo_id]
    assert "aot-mark-dynamic-guard" in [i.id for i in row.issues]
    assert VERIFIED not in row.advice and "unmarked" not in row.advice, row.advice
