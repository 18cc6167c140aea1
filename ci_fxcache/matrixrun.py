"""Run the matrix: plan skips, schedule cold/hot phases on the fork server, judge each combo."""

from __future__ import annotations

import json
import os
import shutil
import socket
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from ci_fxcache import verdicts
from ci_fxcache.env import torch_support
from ci_fxcache.errors import UsageError
from ci_fxcache.matrix import Combo, Matrix
from ci_fxcache.workerpool import ForkServer

REDIS_CONNECT_TIMEOUT_S = 2.0
CHECK_TIMEOUT_S = 120.0


@dataclass
class Settings:
    """How to run: the results document's `settings`, plus where and how wide."""

    phase: str = "both"
    cache_dir: Path = Path(".")
    min_speedup: float = 2.0
    compare: str = "bitwise"
    fail_on: str = "unsafe"
    timeout: float = 600.0
    jobs: int | None = None
    redis_url: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """As the results document's `settings`."""
        return {
            "phase": self.phase,
            "min_speedup": self.min_speedup,
            "compare": self.compare,
            "fail_on": self.fail_on,
            "timeout_s": self.timeout,
        }


def redis_problem(url: str | None, has_module: bool, python: str) -> str | None:
    """Why the `remote` mechanism cannot run, or None. Connects with a bounded timeout."""
    if not url:
        return "Redis not configured (pass --redis-url or set FXCACHE_REDIS_URL)"
    parsed = urlparse(url)
    if parsed.scheme not in ("redis", "rediss") or not parsed.hostname:
        raise UsageError(f"--redis-url {url}: expected redis://HOST[:PORT][/DB]")
    host, port = parsed.hostname, parsed.port or 6379
    try:
        with socket.create_connection((host, port), timeout=REDIS_CONNECT_TIMEOUT_S) as sock:
            sock.settimeout(REDIS_CONNECT_TIMEOUT_S)
            if parsed.password:
                user = parsed.username or "default"
                sock.sendall(_resp("AUTH", user, parsed.password))
                sock.recv(256)
            sock.sendall(_resp("PING"))
            answer = sock.recv(256)
    except OSError as exc:
        return f"Redis at {host}:{port} unreachable ({exc.strerror or exc})"
    if not answer.startswith(b"+PONG"):
        return f"Redis at {host}:{port} did not answer PING ({answer[:60]!r})"
    if not has_module:
        return f"the redis package is not installed for {python} (torch's remote cache needs it)"
    return None


def _resp(*words: str) -> bytes:
    parts = [f"*{len(words)}\r\n".encode()]
    for word in words:
        data = word.encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)


def expand_devices(matrix: Matrix, info: dict[str, Any]) -> None:
    """Replace `auto` by every available device kind (ROCm builds report as cuda)."""
    devices: list[str] = []
    for device in matrix.devices:
        found = ["cpu"] + (["cuda"] if info.get("cuda_capabilities") else [])
        for d in found if device == "auto" else [device]:
            if d not in devices:
                devices.append(d)
    matrix.devices = devices


def skip_reason(combo: Combo, info: dict[str, Any], redis: str | None) -> tuple[str, str] | None:
    """Why a combination cannot run on this runner, as (skipped cause, reason), or None."""
    caps = info.get("cuda_capabilities") or []
    if combo.device == "cuda":
        if not caps:
            return "no-device", "no CUDA device"
        old = min(tuple(c) for c in caps) < (8, 0)
        if combo.dtype.startswith("bfloat16") and not info.get("hip") and old:
            return "gpu-too-old", "bfloat16 needs compute capability 8.0+"
    if combo.mechanism == "remote" and redis:
        return "unsupported", redis
    return None


class Runner:
    """Runs one matrix on one fork server."""

    def __init__(
        self,
        server: ForkServer,
        settings: Settings,
        progress: Callable[[dict[str, Any]], None],
    ) -> None:
        self.server = server
        self.settings = settings
        self.progress = progress
        gpus = len(server.info.get("cuda_capabilities") or [])
        self._gpu_slots: list[int] = list(range(gpus))
        self._gpu_lock = threading.Condition()

    def check_workloads(self, matrix: Matrix) -> None:
        """Import each user workload and call its factory once: exit 2 on a bad one."""
        device = matrix.devices[0] if matrix.devices else "cpu"
        for name in matrix.workloads:
            if ":" not in name:
                continue
            work = self.settings.cache_dir / ".checks" / name.replace(":", "_")
            outcome = self.server.run(
                "check", {"workload": name, "device": device}, work, "check", CHECK_TIMEOUT_S
            )
            result = outcome.result or {}
            if result.get("status") != "ok":
                why = result.get("error") or (
                    f"the check process ended with {outcome.signal or outcome.returncode}"
                    + (f": {outcome.log_tail.splitlines()[-1]}" if outcome.log_tail else "")
                )
                raise UsageError(why)

    def _phase(
        self, combo: Combo, name: str, spec: dict[str, Any]
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        env: dict[str, str] = {}
        slot = None
        if combo.device == "cuda" and self._gpu_slots is not None:
            slot = self._take_gpu()
            visible = (
                "HIP_VISIBLE_DEVICES" if self.server.info.get("hip") else "CUDA_VISIBLE_DEVICES"
            )
            env[visible] = str(slot)
        try:
            outcome = self.server.run(
                "phase", spec, Path(spec["dir"]), name, self.settings.timeout, env
            )
        finally:
            if slot is not None:
                self._give_gpu(slot)
        return verdicts.evidence(outcome, self.settings.timeout), outcome.result or {}

    def _take_gpu(self) -> int:
        with self._gpu_lock:
            while not self._gpu_slots:
                self._gpu_lock.wait()
            return self._gpu_slots.pop(0)

    def _give_gpu(self, slot: int) -> None:
        with self._gpu_lock:
            self._gpu_slots.append(slot)
            self._gpu_lock.notify()

    def spec(self, combo: Combo, phase: str, tag: str) -> dict[str, Any]:
        """The worker's phase spec; hot phases of artifact / remote mechanisms get an empty dir."""
        combo_dir = self.settings.cache_dir / combo.id
        base = combo_dir
        if phase == "hot" and combo.mechanism != "fxgraph":
            base = combo_dir / "hot"
            shutil.rmtree(base, ignore_errors=True)
        return {
            "phase": phase,
            "combo": combo.to_dict(),
            "dir": str(combo_dir),
            "inductor_dir": str(base / "inductor"),
            "triton_dir": str(base / "triton"),
            "eager": phase == "cold",
            "redis_url": self.settings.redis_url,
            "cache_tag": tag,
        }

    def run_combo(self, combo: Combo, hot_only: bool) -> dict[str, Any]:
        """Cold (unless hot-only) then hot, and the verdict."""
        combo_dir = self.settings.cache_dir / combo.id
        reference = combo_dir / "reference.json"
        if hot_only:
            try:
                recorded = json.loads(reference.read_text())
            except (OSError, json.JSONDecodeError):
                return self._result(
                    combo,
                    verdicts.not_judged(
                        "not-run",
                        f"no reference recorded in {combo_dir}: run --phase cold (or both) first",
                    ),
                )
            cold, cold_result, tag = (
                recorded["cold"],
                recorded["cold_result"],
                recorded["cache_tag"],
            )
        else:
            shutil.rmtree(combo_dir, ignore_errors=True)
            combo_dir.mkdir(parents=True)
            tag = f"fxcache-{uuid.uuid4().hex[:12]}" if combo.mechanism == "remote" else ""
            cold, cold_result = self._phase(combo, "cold", self.spec(combo, "cold", tag))
            if cold["status"] == "ok":
                reference.write_text(
                    json.dumps(
                        {
                            "combo": combo.to_dict(),
                            "torch_version": cold_result.get("torch_version"),
                            "cache_tag": tag,
                            "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                            "cold": cold,
                            "cold_result": cold_result,
                        },
                        indent=1,
                    )
                )
        if self.settings.phase == "cold":
            hot: dict[str, Any] = verdicts.not_run("--phase cold: hot phase not requested")
            hot_result: dict[str, Any] = {}
        elif cold["status"] != "ok":
            hot, hot_result = verdicts.not_run("cold phase failed"), {}
        else:
            hot, hot_result = self._phase(combo, "hot", self.spec(combo, "hot", tag))
        judged = verdicts.judge(
            combo.to_dict(), cold, hot, cold_result, hot_result, self.settings.to_dict()
        )
        # judge() calls a hot phase that never ran an error; here it was not asked for
        if self.settings.phase == "cold" and judged["cause"] == "not-run":
            judged.update(
                verdict="skipped",
                cause="unsupported",
                reason="cold phase only (--phase cold): reference recorded, hot not run",
            )
        return self._result(combo, judged)

    def _result(self, combo: Combo, judged: dict[str, Any]) -> dict[str, Any]:
        result = {"id": combo.id, **combo.to_dict(), **judged}
        self.progress(result)
        return result


def has_reference(cache_dir: Path, combo: Combo) -> bool:
    """Whether a cold phase recorded a reference for `combo` under `cache_dir`."""
    return (cache_dir / combo.id / "reference.json").is_file() and (
        cache_dir / combo.id / "reference.pt"
    ).is_file()


def default_jobs(combos: list[Combo], info: dict[str, Any]) -> int:
    """CPU cores for CPU combos plus one per GPU for CUDA combos."""
    jobs = 0
    if any(c.device == "cpu" for c in combos):
        jobs += (
            len(os.sched_getaffinity(0))
            if hasattr(os, "sched_getaffinity")
            else os.cpu_count() or 1
        )
    if any(c.device == "cuda" for c in combos):
        jobs += len(info.get("cuda_capabilities") or [])
    return max(1, jobs)


def run(
    server: ForkServer,
    matrix: Matrix,
    settings: Settings,
    progress: Callable[[dict[str, Any]], None],
) -> tuple[list[dict[str, Any]], str]:
    """Run every combination; returns the combos (in matrix order) and the phase mode used."""
    runner = Runner(server, settings, progress)
    expand_devices(matrix, server.info)
    runner.check_workloads(matrix)
    combos = matrix.combos()
    redis = (
        redis_problem(
            settings.redis_url,
            bool(server.info.get("redis_module")),
            server.info.get("python", "python"),
        )
        if "remote" in matrix.mechanisms
        else None
    )
    torch_version = str(server.info.get("torch") or "")
    skips: dict[str, tuple[str, str]] = {}
    for c in combos:
        gate = torch_support.skip(torch_version, c.to_dict())
        found = (gate["cause"], gate["reason"]) if gate else skip_reason(c, server.info, redis)
        if found is not None:
            skips[c.id] = found
    runnable = [c for c in combos if c.id not in skips]
    phase = settings.phase
    if phase == "auto":
        hot_only = bool(runnable) and all(has_reference(settings.cache_dir, c) for c in runnable)
        phase = "hot" if hot_only else "both"
    results: dict[str, dict[str, Any]] = {}
    for c in combos:
        if c.id in skips:
            results[c.id] = runner._result(c, verdicts.not_judged(*skips[c.id]))
    jobs = settings.jobs or default_jobs(runnable, server.info)
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = {c.id: pool.submit(runner.run_combo, c, phase == "hot") for c in runnable}
        for cid, fut in futures.items():
            results[cid] = fut.result()
    return [results[c.id] for c in combos], phase
