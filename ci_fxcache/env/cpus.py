"""The CPUs this process may use, as a container gives them, and Inductor's compile-thread bound.

Inductor sizes its compile pool as `min(32, torch._utils.cpu_count())` (`decide_compile_threads`
in torch/_inductor/config.py, torch 2.13.0 and 2.14.1), and `cpu_count()` counts only the
affinity mask: a container limited by a CPU quota (`docker --cpus 4`, a Kubernetes CPU limit)
on a 128-core host still gets 32 compile processes. Here the quota counts too: cgroup v2
`cpu.max` ("QUOTA PERIOD", or "max"), cgroup v1 `cpu.cfs_quota_us` / `cpu.cfs_period_us`, on
the process's own cgroup and every ancestor, and the affinity mask; the smallest wins.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

INDUCTOR_MAX_COMPILE_THREADS = 32  # decide_compile_threads(): min(32, cpu_count)
V1_CPU_CONTROLLERS = ("cpu,cpuacct", "cpuacct,cpu", "cpu")


def _quota(quota: str, period: str) -> int | None:
    """CPUs a quota of `quota` per `period` microseconds allows (None: unlimited or unreadable)."""
    try:
        q, p = int(quota), int(period)
    except ValueError:
        return None  # "max": no limit
    if q <= 0 or p <= 0:  # v1 writes -1 for no limit
        return None
    return max(1, math.ceil(q / p))


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _ancestors(mount: Path, cgroup: str) -> list[Path]:
    """`mount/cgroup` and each directory above it up to `mount` (a limit on a parent applies).

    Inside a cgroup namespace the path is `/` and the mount is the container's own cgroup."""
    parts = [p for p in cgroup.strip().split("/") if p and p != ".."]
    return [mount.joinpath(*parts[:n]) for n in range(len(parts), -1, -1)]


def quota_cpus(root: Path = Path("/")) -> int | None:
    """The CPUs the cgroup CPU quota allows this process (None: no quota found)."""
    membership = _read(root / "proc/self/cgroup") or ""
    limits: list[int] = []
    mount = root / "sys/fs/cgroup"
    for line in membership.splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and controllers == "":  # cgroup v2
            for d in _ancestors(mount, path):
                quota, _, period = (_read(d / "cpu.max") or "").partition(" ")
                found = _quota(quota, period or "100000")
                if found is not None:
                    limits.append(found)
        elif "cpu" in controllers.split(","):  # cgroup v1
            for name in V1_CPU_CONTROLLERS:
                if not (mount / name).is_dir():
                    continue
                for d in _ancestors(mount / name, path):
                    v1 = _quota(
                        _read(d / "cpu.cfs_quota_us") or "", _read(d / "cpu.cfs_period_us") or ""
                    )
                    if v1 is not None:
                        limits.append(v1)
                break
    return min(limits) if limits else None


def affinity_cpus() -> int:
    """CPUs in this process's affinity mask (the host's count where there is none)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def usable_cpus(root: Path = Path("/"), affinity: int | None = None) -> int:
    """The CPUs this process can use: its affinity mask, capped by any cgroup CPU quota.

    `root` and `affinity` exist for tests (a fake /proc and /sys tree, a given mask size)."""
    mask = affinity_cpus() if affinity is None else affinity
    quota = quota_cpus(root)
    return max(1, min(mask, quota) if quota is not None else mask)


def compile_threads(phases_at_once: int, cpus: int | None = None) -> int:
    """Inductor compile threads for each of `phases_at_once` phases running side by side: the
    usable CPUs shared among them, within Inductor's own bound (`min(32, cpus)`). One phase
    alone gets exactly the pool Inductor would give itself in this container."""
    cpus = usable_cpus() if cpus is None else cpus
    return max(1, min(INDUCTOR_MAX_COMPILE_THREADS, cpus // max(1, phases_at_once)))
