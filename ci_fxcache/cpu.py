"""The CPU vector ISA that Inductor's C++ kernels are built for, from /proc/cpuinfo."""

from __future__ import annotations

import os
import platform
from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")


def _flags(cpuinfo: str) -> set[str]:
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return set(value.split())
    return set()


def isa_level(cpuinfo: str, machine: str) -> str:
    """Inductor's name for the best vector ISA the flags allow (amx, avx512, avx2, asimd...)."""
    flags = _flags(cpuinfo)
    if machine in ("x86_64", "AMD64", "i686"):
        avx512 = {"avx512f", "avx512dq", "avx512vl", "avx512bw"} <= flags
        if avx512 and {"amx_tile", "avx512_vnni"} <= flags:
            return "amx"
        if avx512:
            return "avx512"
        if {"avx2", "fma"} <= flags:
            return "avx2"
    elif machine in ("aarch64", "arm64"):
        if "sve" in flags:
            return "sve"
        if "asimd" in flags:
            return "asimd"
    elif machine.startswith("ppc64"):
        return "vsx"
    elif machine == "s390x":
        return "zvector"
    return "default"


def detect() -> tuple[str, str | None]:
    """(ISA level of this host, ATEN_CPU_CAPABILITY override or None)."""
    try:
        text = CPUINFO.read_text(encoding="utf-8", errors="replace")
    except OSError:
        text = ""
    override = os.environ.get("ATEN_CPU_CAPABILITY") or None
    return isa_level(text, platform.machine()), override
