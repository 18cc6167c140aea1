"""Which GPU each phase gets: slots from the parent's visible list, hot on cold's device model,
per-device capability skips. A stub fork server stands in where a real GPU would be needed: it
records the environment each phase was given and answers with a plausible phase result."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from ci_fxcache.verify import matrix
from ci_fxcache.verify import runner as verify_runner
from ci_fxcache.verify.forkserver import Outcome

A100 = ("NVIDIA A100-SXM4-80GB", [8, 0])
H100 = ("NVIDIA H100 80GB HBM3", [9, 0])
T4 = ("Tesla T4", [7, 5])
P100 = ("Tesla P100-PCIE-16GB", [6, 0])
MI250X = ("AMD Instinct MI250X", [9, 0])


class StubForkServer:
    """Answers `run()` like the fork server; records (phase, env) and sleeps a little in cold
    phases so that combinations contend for devices."""

    def __init__(self, devices: list[tuple[str, list[int]]], hip: bool = False) -> None:
        self.info: dict[str, Any] = {
            "cuda_capabilities": [cap for _, cap in devices],
            "cuda_names": [name for name, _ in devices],
            "hip": hip,
        }
        self.calls: list[tuple[str, str, dict[str, str]]] = []
        self._lock = threading.Lock()

    def run(
        self,
        kind: str,
        spec: dict[str, Any],
        work_dir: Path,
        name: str,
        timeout: float,
        env: dict[str, str] | None = None,
    ) -> Outcome:
        with self._lock:
            self.calls.append((spec["combo"]["dtype"] + "/" + spec["phase"], name, env or {}))
        if spec["phase"] == "cold":
            threading.Event().wait(0.02)
        result = {
            "status": "ok",
            "compile_s": 10.0 if spec["phase"] == "cold" else 1.0,
            "counters": {"fxgraph_cache_hit": 1} if spec["phase"] == "hot" else {},
            "vs_cold": {"max_abs_err": 0.0, "bitwise": True, "close": True, "detail": ""},
        }
        return Outcome(result, 0, None, False, "")


def _run(
    server: StubForkServer, tmp_path: Path, dtypes: list[str], workloads: int = 4
) -> list[dict[str, Any]]:
    plan = matrix.Matrix(
        devices=["cuda"],
        dtypes=dtypes,
        dynamic=["false"],
        mechanisms=["fxgraph"],
        training=[False],
        workloads=[f"w{i}" for i in range(workloads)],
    )
    runner_settings = verify_runner.Settings(cache_dir=tmp_path, run_dir=tmp_path / "run", jobs=3)
    combos = plan.combos()
    runner = verify_runner.Runner(server, runner_settings, lambda _: None)  # type: ignore[arg-type]
    reasons = {c.id: verify_runner.skip_reason(c, server.info, None) for c in combos}
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=3) as pool:
        futures = [pool.submit(runner.run_combo, c, False) for c in combos if not reasons[c.id]]
        return [f.result() for f in futures]


def _visible(server: StubForkServer, variable: str = "CUDA_VISIBLE_DEVICES") -> set[str]:
    return {env[variable] for _, _, env in server.calls}


def test_phases_use_the_devices_the_job_was_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    server = StubForkServer([H100, H100])
    _run(server, tmp_path, ["float32"])
    assert _visible(server) == {"2", "3"}  # never 0 or 1: those belong to someone else


def test_phases_get_uuids_and_mig_ids_verbatim(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = "MIG-c6d4f1ef-42e4-5de3-91c7-45d71c87eb3f,GPU-0e5e1f3a-8b9c-7d6e-5f4a-3b2c1d0e9f8a"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", ids)
    server = StubForkServer([A100, H100])
    _run(server, tmp_path, ["float32"])
    assert _visible(server) == set(ids.split(","))


@pytest.mark.parametrize(
    ("env", "variable", "values"),
    [
        # ROCR_VISIBLE_DEVICES stays as it is; HIP indexes what ROCr leaves visible
        ({"ROCR_VISIBLE_DEVICES": "4,6"}, "HIP_VISIBLE_DEVICES", {"0", "1"}),
        ({"HIP_VISIBLE_DEVICES": "3,1"}, "HIP_VISIBLE_DEVICES", {"3", "1"}),
        ({"CUDA_VISIBLE_DEVICES": "5,7"}, "CUDA_VISIBLE_DEVICES", {"5", "7"}),
    ],
)
def test_rocm_phases_follow_the_hip_runtime(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    env: dict[str, str],
    variable: str,
    values: set[str],
) -> None:
    for name in ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    server = StubForkServer([MI250X, MI250X], hip=True)
    _run(server, tmp_path, ["float32", "bfloat16"])
    assert _visible(server, variable) == values
    assert all({k for k in e if "VISIBLE" in k} == {variable} for _, _, e in server.calls)


def test_hot_runs_on_a_device_like_cold_on_a_mixed_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    server = StubForkServer([A100, H100, A100])
    results = _run(server, tmp_path, ["float32", "float16"], workloads=6)
    assert len(results) == 12
    for combo in results:
        assert combo["hot"]["gpu"]["name"] == combo["cold"]["gpu"]["name"]
        assert combo["hot"]["gpu"]["capability"] == combo["cold"]["gpu"]["capability"]
    assert len({c["cold"]["gpu"]["name"] for c in results}) == 2  # both models were used


def test_hot_waits_for_a_device_of_cold_model(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    server = StubForkServer([A100, H100, A100])
    runner = verify_runner.Runner(
        server, verify_runner.Settings(cache_dir=tmp_path, run_dir=tmp_path / "run"), lambda _: None
    )  # type: ignore[arg-type]
    combo = matrix.Combo("w", "cuda", "float32", "false", "fxgraph", False)
    cold, h100, a100 = (runner._take_gpu(combo, None) for _ in range(3))
    assert [cold.visible, h100.name, a100.visible] == ["0", H100[0], "2"]
    runner._give_gpu(h100)  # cold's own device stays busy (another combination's phase)
    runner._give_gpu(a100)
    twin = runner._take_gpu(combo, cold)
    assert twin is a100  # same model, not the free H100
    got: list[verify_runner.GpuSlot] = []
    waiter = threading.Thread(target=lambda: got.append(runner._take_gpu(combo, cold)))
    waiter.start()
    waiter.join(0.3)
    assert waiter.is_alive() and not got  # the H100 is free, but it is another model
    runner._give_gpu(twin)
    waiter.join(30)
    assert got == [twin]


def test_bfloat16_runs_only_on_devices_that_support_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    server = StubForkServer([T4, A100])
    results = _run(server, tmp_path, ["float32", "bfloat16"])
    assert len(results) == 8  # bf16 is not skipped: one device supports it
    bf16 = {env["CUDA_VISIBLE_DEVICES"] for d, _, env in server.calls if d.startswith("bfloat16")}
    assert bf16 == {"1"}
    assert {env["CUDA_VISIBLE_DEVICES"] for _, _, env in server.calls} == {"0", "1"}


@pytest.mark.parametrize(
    ("devices", "dtype", "cause", "words"),
    [
        ([T4], "bfloat16", "gpu-too-old", "bfloat16 needs compute capability 8.0+"),
        ([P100], "float32", "gpu-too-old", "GPUTooOldForTriton"),
        ([P100, T4], "bfloat16-autocast", "gpu-too-old", "6.0, 7.5"),
        ([], "float32", "no-device", "no CUDA device"),
    ],
)
def test_skips_name_their_cause(
    devices: list[tuple[str, list[int]]], dtype: str, cause: str, words: str
) -> None:
    combo = matrix.Combo("sin_matmul", "cuda", dtype, "false", "fxgraph", True)
    skip = verify_runner.skip_reason(combo, StubForkServer(devices).info, None)
    assert skip is not None and skip.cause == cause and words in skip.reason


def test_old_gpu_beside_a_new_one_is_not_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    server = StubForkServer([P100, H100])
    combo = matrix.Combo("sin_matmul", "cuda", "float32", "false", "fxgraph", False)
    assert verify_runner.skip_reason(combo, server.info, None) is None
    _run(server, tmp_path, ["float32"])
    assert _visible(server) == {"1"}


def test_rocm_ignores_nvidia_capability_limits() -> None:
    combo = matrix.Combo("sin_matmul", "cuda", "bfloat16", "false", "fxgraph", False)
    info = StubForkServer([("AMD Instinct MI100", [9, 0])], hip=True).info
    info["cuda_capabilities"] = [[6, 0]]  # a gfx version, not an NVIDIA capability
    assert verify_runner.skip_reason(combo, info, None) is None
