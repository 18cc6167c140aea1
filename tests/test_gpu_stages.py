"""GPU phases are never timed beside CPU phases, and a GPU phase gets Inductor's own compile
pool; the pool size follows the CPUs a container gives (cgroup v1/v2 quota, affinity). A stub
fork server stands in for the devices (as in test_gpu_slots.py)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from ci_fxcache.env import cpus
from ci_fxcache.verify import matrix
from ci_fxcache.verify import runner as verify_runner
from ci_fxcache.verify.forkserver import Outcome
from tests.test_gpu_slots import H100, StubForkServer


class TimingForkServer(StubForkServer):
    """test_gpu_slots' stub fork server that also records each phase's device, interval and
    environment, and makes every phase last long enough for each pool thread to start one."""

    def __init__(self, gpus: int) -> None:
        super().__init__([H100] * gpus)
        self.phases: list[tuple[str, str, float, float, dict[str, str]]] = []

    def run(
        self,
        kind: str,
        spec: dict[str, Any],
        work_dir: Path,
        name: str,
        timeout: float,
        env: dict[str, str] | None = None,
    ) -> Outcome:
        started = time.monotonic()
        threading.Event().wait(0.05)
        outcome = super().run(kind, spec, work_dir, name, timeout, env)
        with self._lock:
            self.phases.append(
                (spec["combo"]["device"], spec["phase"], started, time.monotonic(), env or {})
            )
        return outcome


def _plan(workloads: int) -> matrix.Matrix:
    return matrix.Matrix(
        devices=["auto"],
        dtypes=["float32"],
        dynamic=["false"],
        mechanisms=["fxgraph"],
        training=[False],
        workloads=[f"w{i}" for i in range(workloads)],
    )


@pytest.mark.parametrize("gpus", [1, 2])
def test_gpu_phases_never_overlap_cpu_phases(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gpus: int
) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv(verify_runner.COMPILE_THREADS, raising=False)
    monkeypatch.setattr(cpus, "usable_cpus", lambda *a, **k: 16)
    server = TimingForkServer(gpus)
    settings = verify_runner.Settings(cache_dir=tmp_path, run_dir=tmp_path / "run", jobs=4)
    results, _ = verify_runner.run(server, _plan(4), settings, lambda _: None)  # type: ignore[arg-type]
    assert len(results) == 8 and {r["verdict"] for r in results} == {"safe"}
    gpu = [p for p in server.phases if p[0] == "cuda"]
    cpu = [p for p in server.phases if p[0] == "cpu"]
    assert len(gpu) == len(cpu) == 8
    for g in gpu:
        for c in cpu:
            assert g[3] <= c[2] or c[3] <= g[2], f"GPU phase {g[:4]} overlaps CPU phase {c[:4]}"
    assert max(g[3] for g in gpu) <= min(c[2] for c in cpu)  # GPU stage first
    # one GPU: the phase alone on the machine gets Inductor's own pool, min(32, 16)
    gpu_threads = {p[4][verify_runner.COMPILE_THREADS] for p in gpu if p[1] == "cold"}
    assert gpu_threads == {str(16 // gpus)}
    assert {p[4][verify_runner.COMPILE_THREADS] for p in cpu} == {"4"}  # 16 CPUs, 4 at once


def test_a_user_setting_of_compile_threads_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv(verify_runner.COMPILE_THREADS, "3")
    server = TimingForkServer(1)
    settings = verify_runner.Settings(cache_dir=tmp_path, run_dir=tmp_path / "run")
    verify_runner.run(server, _plan(1), settings, lambda _: None)  # type: ignore[arg-type]
    assert all(verify_runner.COMPILE_THREADS not in p[4] for p in server.phases)


def _tree(tmp_path: Path, cgroup: str, files: dict[str, str]) -> Path:
    root = tmp_path / "root"
    (root / "proc/self").mkdir(parents=True)
    (root / "proc/self/cgroup").write_text(cgroup)
    for name, text in files.items():
        path = root / "sys/fs/cgroup" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


@pytest.mark.parametrize(
    ("cgroup", "files", "affinity", "want"),
    [
        # cgroup v2 inside a namespace: the container's own cpu.max at the mount
        ("0::/\n", {"cpu.max": "400000 100000\n"}, 128, 4),
        ("0::/\n", {"cpu.max": "max 100000\n"}, 128, 128),
        ("0::/\n", {"cpu.max": "150000 100000\n"}, 128, 2),  # 1.5 CPUs: rounded up
        # a limit on a parent applies to the child
        (
            "0::/kubepods/pod1/ctr\n",
            {"kubepods/pod1/cpu.max": "200000 100000", "kubepods/pod1/ctr/cpu.max": "max 100000"},
            64,
            2,
        ),
        ("0::/\n", {"cpu.max": "800000 100000"}, 3, 3),  # the affinity mask is smaller
        # cgroup v1 CFS quota
        (
            "12:cpu,cpuacct:/docker/abc\n11:memory:/docker/abc\n",
            {
                "cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "600000",
                "cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000",
            },
            96,
            6,
        ),
        (
            "12:cpu,cpuacct:/\n",
            {"cpu,cpuacct/cpu.cfs_quota_us": "-1", "cpu,cpuacct/cpu.cfs_period_us": "100000"},
            96,
            96,
        ),
        ("", {}, 8, 8),  # no cgroup information: the mask
        ("0::/\n", {"cpu.max": "garbage"}, 8, 8),
    ],
)
def test_usable_cpus_count_what_the_container_gives(
    tmp_path: Path, cgroup: str, files: dict[str, str], affinity: int, want: int
) -> None:
    root = _tree(tmp_path, cgroup, files)
    assert cpus.usable_cpus(root, affinity=affinity) == want


def test_compile_threads_follow_inductors_bound() -> None:
    assert [cpus.compile_threads(j, cpus=64) for j in (1, 2, 8, 64, 100)] == [32, 32, 8, 1, 1]
    assert cpus.compile_threads(1, cpus=16) == 16  # one GPU phase on a 16-core machine
    assert cpus.compile_threads(1, cpus=1) == 1
