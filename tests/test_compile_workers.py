"""Inductor's compile worker pool is bounded by the phases that run at once: counted during real
`fxcache verify` runs with the second torch's CUDA wheel (2.15.0), which ships Triton (so the pool
exists)."""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from benchmarks.gpu_check import peak_compile_workers
from ci_fxcache.env import cpus
from ci_fxcache.verify import runner
from tests.conftest import ROOT, _clean_env, torch2_python

pytestmark = pytest.mark.slow

WORKLOAD = "tests.workloads.compile_pool:sin_matmul"


def peak(args: list[str], env: dict[str, str]) -> int:
    """Run `fxcache verify ARGS`: the most compile-worker processes alive at once under it."""
    argv = [sys.executable, "-m", "ci_fxcache", "verify", "--python", torch2_python(), *args]
    status, most = peak_compile_workers(
        argv, cwd=ROOT, env=_clean_env(env), stdout=subprocess.DEVNULL
    )
    assert status == 0
    return most


def test_parallel_phases_share_the_cores_for_compile_workers(tmp_path: Path) -> None:
    common = ["--device", "cpu", "--dtypes", "float32", "--dynamic", "false"]
    common += ["--mechanisms", "fxgraph", "--training", "false", "--phase", "cold"]
    jobs = 2
    threads = runner.compile_threads(jobs)
    workloads = f"{WORKLOAD},{WORKLOAD}_b"
    with ThreadPoolExecutor(2) as pool:  # two runs side by side, each counted in its own tree
        # The pool is there to be counted: a user's own TORCHINDUCTOR_COMPILE_THREADS is kept.
        chosen = pool.submit(
            peak,
            [*common, "--workloads", WORKLOAD, "--cache-dir", str(tmp_path / "a")],
            {"TORCHINDUCTOR_COMPILE_THREADS": "2"},
        )
        # Two phases at once: each gets half the cores (unbounded: min(32, cores) each).
        bounded = pool.submit(
            peak,
            [*common, "--workloads", workloads, "--jobs", str(jobs), "--cache-dir", str(tmp_path)],
            {},
        )
        assert chosen.result() >= 2, "the stand-in workload did not start Inductor's pool"
        most = bounded.result()
    bound = 0 if threads == 1 else jobs * (1 + threads)  # the sidecar plus its workers
    assert most <= bound, f"{most} compile-worker processes for {jobs} phases of {threads} threads"


def test_compile_threads_divide_the_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpus, "usable_cpus", lambda *a, **k: 64)
    # Inductor's own bound: never more than min(32, usable CPUs)
    assert [runner.compile_threads(j) for j in (1, 2, 8, 64, 100)] == [32, 32, 8, 1, 1]
