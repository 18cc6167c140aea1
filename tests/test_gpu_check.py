"""`benchmarks/gpu_check.sh`: its CPU fallback end to end, and its checks against GPU-run results
(written here as a GPU run would write them, with one fault injected per check)."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks import gpu_check
from tests.conftest import ROOT, _clean_env

UUID = "GPU-0e5e1f3a-8b9c-7d6e-5f4a-3b2c1d0e9f8a"


@pytest.mark.slow
def test_cpu_fallback_writes_every_file_and_skips_cuda(tmp_path: Path) -> None:
    from tests.test_results_schema import validate

    out = tmp_path / "out"
    env = _clean_env({"PYTHON": sys.executable, "OUT_DIR": str(out), "PATH": "/usr/bin:/bin"})
    proc = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "gpu_check.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    names = {p.name for p in out.iterdir()}
    assert names == {
        "gpu_check.log",
        "fingerprint.json",
        "default-cuda.json",
        "default-cuda.md",
        "transformer-bf16.json",
        "transformer-bf16.md",
        "checks.json",
    }
    assert len(names) <= 8  # what the device machine sends back
    default = json.loads((out / "default-cuda.json").read_text())
    validate(default)
    assert len(default["combos"]) == 12
    assert {c["cause"] for c in default["combos"]} == {"no-device"}
    transformer = json.loads((out / "transformer-bf16.json").read_text())
    assert [
        (c["workload"], c["dtype"], c["dynamic"], c["mechanism"]) for c in transformer["combos"]
    ] == [("transformer_block", "bfloat16", "true", "precompile")] * 2
    checks = json.loads((out / "checks.json").read_text())
    assert checks["failed"] == [] and checks["verdicts"] == {"skipped": 14}
    assert "no CUDA device" in (out / "default-cuda.md").read_text()
    assert "== done in" in (out / "gpu_check.log").read_text()


def _phase(visible: str = UUID, name: str = "NVIDIA H100 80GB HBM3") -> dict[str, Any]:
    return {"status": "ok", "gpu": {"visible": visible, "name": name, "capability": "9.0"}}


def _gpu_run(tmp_path: Path) -> tuple[Path, Path, dict[str, Any]]:
    out, work = tmp_path / "out", tmp_path / "work"
    out.mkdir()
    work.mkdir()
    fingerprint = {
        "fingerprint": {"gpus": [{"index": 0, "name": "NVIDIA H100 80GB HBM3"}]},
        "scope_key": "fxcache-v1-k-sm90-abc",
        "probe": {"ok": True, "fields": []},
    }
    (out / "fingerprint.json").write_text(json.dumps(fingerprint))
    (work / "fingerprint-uuid.json").write_text(json.dumps(fingerprint))
    (work / "uuid").write_text(f"uuid={UUID}\n")
    results = {
        "combos": [
            {"id": "a", "verdict": "safe", "cold": _phase(), "hot": _phase()},
            {"id": "b", "verdict": "skipped", "cause": "gpu-too-old", "cold": None, "hot": None},
        ]
    }
    (work / "default-cuda.peak.json").write_text(
        json.dumps({"peak_compile_workers": 0, "threads": 16})
    )
    return out, work, results


def _faults() -> list[tuple[str, Any]]:
    def hot_elsewhere(r: dict[str, Any]) -> None:
        r["combos"][0]["hot"] = _phase("GPU-other", "NVIDIA A100-SXM4-80GB")

    def cold_elsewhere(r: dict[str, Any]) -> None:
        r["combos"][0]["cold"] = r["combos"][0]["hot"] = _phase("0")

    def uncaused(r: dict[str, Any]) -> None:
        del r["combos"][1]["cause"]

    return [
        (["slots", "hot on cold's device"], hot_elsewhere),
        (["slots"], cold_elsewhere),
        (["skip causes"], uncaused),
    ]


def test_checks_pass_on_a_good_gpu_run(tmp_path: Path) -> None:
    out, work, results = _gpu_run(tmp_path)
    (out / "default-cuda.json").write_text(json.dumps(results))
    assert gpu_check.check(out, work) == 0
    assert json.loads((out / "checks.json").read_text())["verdicts"] == {"safe": 1, "skipped": 1}


@pytest.mark.parametrize(("failing", "fault"), _faults(), ids=[f[1].__name__ for f in _faults()])
def test_checks_catch_each_fault(tmp_path: Path, failing: list[str], fault: Any) -> None:
    out, work, results = _gpu_run(tmp_path)
    broken = copy.deepcopy(results)
    fault(broken)
    (out / "default-cuda.json").write_text(json.dumps(broken))
    assert gpu_check.check(out, work) == 1
    assert json.loads((out / "checks.json").read_text())["failed"] == failing


def test_checks_catch_unbounded_compile_workers_and_a_bad_probe(tmp_path: Path) -> None:
    out, work, results = _gpu_run(tmp_path)
    (out / "default-cuda.json").write_text(json.dumps(results))
    (work / "default-cuda.peak.json").write_text(
        json.dumps({"peak_compile_workers": 18, "threads": 16})  # bound: sidecar + 16
    )
    doc = json.loads((out / "fingerprint.json").read_text())
    doc["probe"]["ok"] = False
    (out / "fingerprint.json").write_text(json.dumps(doc))
    assert gpu_check.check(out, work) == 1
    failed = json.loads((out / "checks.json").read_text())["failed"]
    assert failed == ["probe", "compile workers (default-cuda)"]


def test_env_checks_compare_the_no_import_views_with_torch(tmp_path: Path) -> None:
    """`gpu_check.py env-checks` on this host: torch 2.13.0 (CPU) sees no device, nor do
    nvidia-smi (absent) and the driver (no libcuda): every row agrees, and the file is written."""
    code = gpu_check.env_checks(tmp_path, [None, {"CUDA_VISIBLE_DEVICES": "0,0"}])
    doc = json.loads((tmp_path / "env-checks.json").read_text())
    assert code == 0 and doc["failed"] == 0 and len(doc["rows"]) == 2
    assert all(row["torch"] == [] for row in doc["rows"])


def test_env_checks_report_a_driver_torch_does_not_agree_with(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fault injection: a stub libcuda.so.1 reports an H200 that torch does not see."""
    from tests.test_gpu_driver import H200, libcuda_dir

    monkeypatch.setenv("LD_LIBRARY_PATH", str(libcuda_dir(tmp_path / "lib")))
    monkeypatch.setenv("STUB_CUDA_DEVICES", H200)
    assert gpu_check.env_checks(tmp_path, [None]) == 1
    (row,) = json.loads((tmp_path / "env-checks.json").read_text())["rows"]
    assert row["libcuda"] == ["NVIDIA H200"] and row["ok"]["libcuda"] is False
    assert row["libcuda_path"].endswith("libcuda.so.1")
