"""`benchmarks/gpu_check.sh`: its dry run, its preflight stop, its CPU fallback end to end, and
its checks against GPU-run results (written here as a GPU run would write them, with one fault
injected per check)."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest

from benchmarks import gpu_check
from tests.conftest import ROOT, _clean_env, torch_build

UUID = "GPU-0e5e1f3a-8b9c-7d6e-5f4a-3b2c1d0e9f8a"
SCRIPT = ROOT / "benchmarks" / "gpu_check.sh"
OUT_FILES = {"gpu_check.log", "preflight.json", "checks.json", "table.txt", "evidence.tar.gz"}


def _script(out: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    full = _clean_env({"PYTHON": sys.executable, "OUT_DIR": str(out), "PATH": "/usr/bin:/bin"})
    return subprocess.run(
        ["bash", str(SCRIPT), *args],
        env={**full, **env},
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )


def test_dry_run_shows_the_plan_and_the_budget_and_runs_nothing(tmp_path: Path) -> None:
    proc = _script(tmp_path / "out", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    for step in ("preflight", "default-auto", "cuda-alone", "second-hot", "transformer-bf16"):
        assert step in proc.stdout
    for step in ("nondeterminism", "real-models", "env-checks", "archive", "table"):
        assert step in proc.stdout
    assert "stop at\n360 s" in proc.stdout
    assert "the whole run ends within 450 s (8 minutes: 480 s)" in proc.stdout
    assert not (tmp_path / "out").exists()


def test_preflight_stops_without_torch_and_still_writes_its_checks(tmp_path: Path) -> None:
    stand_in = tmp_path / "site" / "torch"
    stand_in.mkdir(parents=True)
    (stand_in / "__init__.py").write_text("raise ImportError('stand-in: no torch here')\n")
    out = tmp_path / "out"
    proc = _script(out, PYTHONPATH=str(stand_in.parent))
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    log = (out / "gpu_check.log").read_text()
    assert "preflight: STOP: torch is not importable" in log
    assert "stand-in: no torch here" in log
    assert "== STOP: torch or the toolkit is missing" in log
    assert "== default-auto: skipped (the preflight stopped the run)" in log
    assert {p.name for p in out.iterdir()} == OUT_FILES
    checks = json.loads((out / "checks.json").read_text())
    assert checks["failed"] == ["preflight"]


@pytest.mark.slow
def test_cpu_fallback_writes_every_file_and_skips_cuda(tmp_path: Path) -> None:
    from tests.test_results_schema import validate

    out = tmp_path / "out"
    proc = _script(out)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    names = {p.name for p in out.iterdir()}
    assert names == OUT_FILES and len(names) <= 8  # what the device machine sends back
    preflight = json.loads((out / "preflight.json").read_text())
    assert preflight["torch"].startswith("2.13.0") and preflight["cuda_available"] is False
    assert preflight["nproc"] >= 1 and preflight["usable_cpus"] >= 1
    log = (out / "gpu_check.log").read_text()
    # The pinned torch's CPU build says why; its CUDA build on a machine without a GPU too.
    why = "torch.cuda.is_available() is False" if torch_build().cuda else "a CPU build of torch"
    assert f"preflight: no CUDA device seen by torch ({why}): CPU fallback" in log
    assert "== ranks-2" not in log  # one GPU or none: no 2-rank step at all
    for gpu_only in ("modes", "cuda-alone", "second-hot", "nondeterminism", "real-models"):
        assert f"== {gpu_only}: skipped (needs a GPU: CPU fallback)" in log
    with tarfile.open(out / "evidence.tar.gz") as tar:
        members = set(tar.getnames())
        default = json.load(tar.extractfile("results/default-auto.json"))  # type: ignore[arg-type]
        transformer = json.load(tar.extractfile("results/transformer-bf16.json"))  # type: ignore[arg-type]
    assert {"reports/default-auto.md", "listing-default-auto.txt", "steps"} <= members
    assert any(m.startswith("logs/default-auto/") for m in members)
    validate(default)
    assert len(default["combos"]) == 20
    # torch 2.13.0 has no precompile module: those are gated before the device is asked for
    assert {(c["mechanism"] == "precompile-api", c["cause"]) for c in default["combos"]} == {
        (False, "no-device"),
        (True, "torch-too-old"),
    }
    assert [
        (c["workload"], c["dtype"], c["dynamic"], c["mechanism"]) for c in transformer["combos"]
    ] == [("transformer_block", "bfloat16", "true", "precompile")] * 2
    checks = json.loads((out / "checks.json").read_text())
    assert checks["failed"] == [] and checks["verdicts"] == {"skipped": 22}
    table = (out / "table.txt").read_text()
    assert len(table) < 12_000 and table.count("no-device") == 18  # + 4 torch-too-old
    assert log.rstrip().endswith(table.rstrip().splitlines()[-1])  # the table comes last
    assert "== done in" in log


def _phase(visible: str = UUID, name: str = "NVIDIA H100 80GB HBM3", **kw: Any) -> dict[str, Any]:
    return {
        "status": "ok",
        "gpu": {"visible": visible, "name": name, "capability": "9.0"},
        "compile_s": 3.0,
        "triton_count": "listener",
        "triton_kernels_built": 0,
        **kw,
    }


def _gpu_run(tmp_path: Path) -> tuple[Path, Path, dict[str, Any]]:
    out, work = tmp_path / "out", tmp_path / "work"
    out.mkdir()
    (work / "results").mkdir(parents=True)
    fingerprint = {
        "fingerprint": {"gpus": [{"index": 0, "name": "NVIDIA H100 80GB HBM3"}]},
        "scope_key": "fxcache-v1-k-sm90-abc",
        "probe": {"ok": True, "fields": []},
    }
    preflight = {"torch": "2.11.0+cu130", "gpus": [{"index": 0, "uuid": UUID}]}
    (work / "preflight.json").write_text(json.dumps(preflight))
    (work / "fingerprint.json").write_text(json.dumps(fingerprint))
    (work / "fingerprint-uuid.json").write_text(json.dumps(fingerprint))
    (work / "uuid").write_text(f"uuid={UUID}\n")
    (work / "listing-default-auto.txt").write_text(
        "      2048 sin_matmul-cuda-float32-static-fxgraph-train/triton/AB/triton_poi_0.cubin\n"
        "     70000 sin_matmul-cuda-float32-static-fxgraph-train/triton/CD/cuda_utils.so\n"
    )
    results = {
        "combos": [
            {
                "id": "a",
                "device": "cuda",
                "verdict": "safe",
                "hits": 2,
                "misses": 0,
                "cold": _phase(),
                "hot": _phase(),
            },
            {
                "id": "b",
                "device": "cuda",
                "verdict": "skipped",
                "cause": "gpu-too-old",
                "cold": None,
                "hot": None,
            },
            {"id": "c", "device": "cpu", "verdict": "safe", "cold": {}, "hot": {}},
        ]
    }
    second = {
        "combos": [
            {
                "id": "a",
                "device": "cuda",
                "verdict": "safe",
                "hits": 2,
                "misses": 0,
                "cold": _phase(),
                "hot": _phase(),
            }
        ]
    }
    (work / "results" / "second-hot.json").write_text(json.dumps(second))
    (work / "default-auto.peak.json").write_text(
        json.dumps({"peak_compile_workers": 0, "threads": 16})
    )
    return out, work, results


def _faults() -> list[tuple[list[str], Any]]:
    def hot_elsewhere(r: dict[str, Any]) -> None:
        r["combos"][0]["hot"] = _phase("GPU-other", "NVIDIA A100-SXM4-80GB")

    def cold_elsewhere(r: dict[str, Any]) -> None:
        r["combos"][0]["cold"] = r["combos"][0]["hot"] = _phase("0")

    def uncaused(r: dict[str, Any]) -> None:
        del r["combos"][1]["cause"]

    def silently_uncounted(r: dict[str, Any]) -> None:
        del r["combos"][0]["hot"]["triton_count"]

    return [
        (["slots", "hot on cold's device"], hot_elsewhere),
        (["slots"], cold_elsewhere),
        (["skip causes"], uncaused),
        (["triton counted"], silently_uncounted),
    ]


def _write(work: Path, results: dict[str, Any]) -> None:
    (work / "results" / "default-auto.json").write_text(json.dumps(results))


def test_checks_pass_on_a_good_gpu_run(tmp_path: Path) -> None:
    out, work, results = _gpu_run(tmp_path)
    _write(work, results)
    assert gpu_check.check(out, work) == 0
    assert json.loads((out / "checks.json").read_text())["verdicts"] == {"safe": 3, "skipped": 1}


@pytest.mark.parametrize(("failing", "fault"), _faults(), ids=[f[1].__name__ for f in _faults()])
def test_checks_catch_each_fault(tmp_path: Path, failing: list[str], fault: Any) -> None:
    out, work, results = _gpu_run(tmp_path)
    broken = copy.deepcopy(results)
    fault(broken)
    _write(work, broken)
    assert gpu_check.check(out, work) == 1
    assert json.loads((out / "checks.json").read_text())["failed"] == failing


def test_checks_catch_unbounded_workers_a_bad_probe_an_empty_cache_and_a_missed_rerun(
    tmp_path: Path,
) -> None:
    out, work, results = _gpu_run(tmp_path)
    _write(work, results)
    (work / "default-auto.peak.json").write_text(
        json.dumps({"peak_compile_workers": 18, "threads": 16})  # bound: sidecar + 16
    )
    doc = json.loads((work / "fingerprint.json").read_text())
    doc["probe"]["ok"] = False
    (work / "fingerprint.json").write_text(json.dumps(doc))
    (work / "listing-default-auto.txt").write_text("        10 x/reference.json\n")
    second = json.loads((work / "results" / "second-hot.json").read_text())
    second["combos"][0]["misses"] = 1
    (work / "results" / "second-hot.json").write_text(json.dumps(second))
    assert gpu_check.check(out, work) == 1
    failed = json.loads((out / "checks.json").read_text())["failed"]
    assert failed == [
        "probe",
        "triton cache",
        "second hot process",
        "compile workers (default-auto)",
    ]


def test_the_table_fits_and_says_what_it_left_out(tmp_path: Path) -> None:
    _, work, results = _gpu_run(tmp_path)
    many = {
        "combos": [dict(results["combos"][0], id=f"model-{i:03d}-" + "x" * 60) for i in range(300)]
    }
    _write(work, many)
    text = gpu_check.table(work)
    assert len(text) <= gpu_check.TABLE_LIMIT
    assert "more rows in the results (evidence archive)" in text.splitlines()[-1]
    row = text.splitlines()[2]
    assert "safe" in row and "3.0" in row and "2/0" in row


def test_phase_logs_are_copied_before_verify_deletes_them(tmp_path: Path) -> None:
    source, dest = tmp_path / "tmp", tmp_path / "logs"
    log = source / "fxcache-run-abc" / "combo-1" / "cold.log"
    log.parent.mkdir(parents=True)
    log.write_text("compiling\n")
    gpu_check.copy_logs(source, dest)
    log.write_text("compiling\ndone\n")
    gpu_check.copy_logs(source, dest)
    assert (dest / "combo-1__cold.log").read_text() == "compiling\ndone\n"


def test_auto_and_alone_times_are_set_side_by_side(tmp_path: Path) -> None:
    out, work, results = _gpu_run(tmp_path)
    _write(work, results)
    alone = {"combos": [dict(results["combos"][0], cold=_phase(compile_s=2.0))]}
    (work / "results" / "cuda-alone.json").write_text(json.dumps(alone))
    assert gpu_check.check(out, work) == 0
    measured = json.loads((out / "checks.json").read_text())["measured"]
    assert measured["cold_auto_vs_alone"] == {
        "combinations": 1,
        "auto_s": 3.0,
        "alone_s": 2.0,
        "ratio": 1.5,
    }
    assert measured["hot_auto_vs_alone"]["ratio"] == 1.0


def test_env_checks_join_the_checks(tmp_path: Path) -> None:
    out, work, results = _gpu_run(tmp_path)
    _write(work, results)
    env = {"checks": [{"check": "libcuda", "ok": False, "detail": "cuInit returned 100"}]}
    (work / gpu_check.ENV_CHECKS).write_text(json.dumps(env))
    assert gpu_check.check(out, work) == 1
    assert json.loads((out / "checks.json").read_text())["failed"] == ["env: libcuda"]


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


@pytest.mark.parametrize(
    ("preflight", "steps"),
    [
        (None, ["modes", "ranks-2"]),  # the dry run: every step it may take
        ({"gpus": []}, ["modes"]),  # the CPU fallback skips it as every GPU step
        ({"gpus": [{"index": 0}]}, ["modes"]),
        ({"gpus": [{"index": 0}, {"index": 1}]}, ["modes", "ranks-2"]),
    ],
)
def test_modes_run_on_any_gpu_and_two_ranks_only_with_two_gpus(
    tmp_path: Path, preflight: dict[str, Any] | None, steps: list[str]
) -> None:
    if preflight is not None:
        (tmp_path / "preflight.json").write_text(json.dumps(preflight))
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "extra-steps", str(tmp_path)],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    lines = [line.split() for line in proc.stdout.splitlines()]
    assert [words[0] for words in lines] == steps
    for name, cap, *args in lines:
        assert int(cap) <= 90 and args[:2] == ["--device", "cuda"]
        flag, value = ("--modes", "max-autotune,reduce-overhead") if name == "modes" else (
            "--ranks", "2")  # fmt: skip
        assert args[args.index(flag) + 1] == value


@pytest.mark.parametrize(
    ("name", "combo", "ok"),
    [
        ("modes", {"verdict": "safe"}, True),
        ("modes", {"verdict": "skipped"}, True),  # a mode this GPU cannot run, with its cause
        ("modes", {"verdict": "unsafe"}, False),
        ("ranks-2", {"verdict": "safe", "rank_verdicts": [{}, {}]}, True),
        ("ranks-2", {"verdict": "safe", "rank_verdicts": [{}]}, False),
        ("ranks-2", {"verdict": "error", "rank_verdicts": [{}, {}]}, False),
    ],
)
def test_mode_and_rank_rows_are_checked_where_their_steps_ran(
    name: str, combo: dict[str, Any], ok: bool
) -> None:
    seen: list[tuple[str, bool]] = []
    gpu_check._mode_and_rank_checks(
        {name: [{"id": "mlp-cuda", **combo}]}, lambda n, good, _: seen.append((n, good))
    )
    gpu_check._mode_and_rank_checks({}, lambda n, good, _: seen.append((n, good)))
    assert seen == [(name, ok)]
