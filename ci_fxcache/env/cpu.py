"""The CPU vector ISA that Inductor's C++ kernels are built for, without importing torch.

Inductor's own choice (`torch._inductor.cpu_vec_isa.pick_vec_isa`, torch 2.13 / 2.14) is written
down here once, and `fxcache fingerprint --probe` checks it against the real thing:

- x86_64: the first of AMX, AVX-512 VNNI, AVX-512, AVX2 that the CPU supports, where (ATen's
  `aten/src/ATen/cpu/Utils.cpp`, through cpuinfo) AVX-512 means avx512f + avx512vl + avx512bw +
  avx512dq, VNNI adds avx512_vnni, AMX adds amx_tile, and AVX2 is avx2.
- aarch64: SVE when the CPU has SVE (or SVE2) *and* BF16, with 128-bit vectors when the kernel
  reports a 16-byte SVE vector length (Graviton 4, Neoverse V2) and 256-bit otherwise
  (Graviton 3); NEON (`asimd`) otherwise (Graviton 2).
- ppc64le: VSX; s390x: z/Vector when the `vxe` facility is present; anything else: no vector
  ISA (`default`).
- `ATEN_CPU_CAPABILITY` (`get_isa_from_cpu_capability`): `default` turns vectorisation off,
  `avx2` picks AVX2, `avx512` picks the *best* AVX-512 flavour (AMX first), `vsx` / `zvector`
  theirs; a value the CPU cannot honour is ignored (Inductor warns and keeps its first choice).

Not covered without importing torch: Inductor also test-compiles each ISA with the host's C++
compiler (and AMX needs the kernel to grant the AMX state); a compiler too old for a flag makes
Inductor fall back a level, which `--probe` reports as a mismatch. `TORCHINDUCTOR_CPP_SIMDLEN`
(Inductor's `cpp.simdlen`) also changes the choice and is not modelled.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")
# Linux reports the default SVE vector length in bytes here (16 = 128-bit, 32 = 256-bit).
SVE_VECTOR_LENGTH = Path("/proc/sys/abi/sve_default_vector_length")

X86_MACHINES = ("x86_64", "AMD64", "i686")
ARM_MACHINES = ("aarch64", "arm64")

# Inductor's VecISA class (and SVE bit width) -> our name for it. The probe reports the class.
INDUCTOR_CLASSES = {
    "VecAMX": "amx",
    "VecAVX512VNNI": "avx512_vnni",
    "VecAVX512": "avx512",
    "VecAVX2": "avx2",
    "VecNEON": "asimd",
    "VecSVE128": "sve128",
    "VecSVE256": "sve256",
    "VecVSX": "vsx",
    "VecZVECTOR": "zvector",
    "InvalidVecISA": "default",
}
ISA_NAMES = (*dict.fromkeys(INDUCTOR_CLASSES.values()),)

_AVX512 = frozenset({"avx512f", "avx512vl", "avx512bw", "avx512dq"})
# ATEN_CPU_CAPABILITY value -> the ISAs it may select, best first (None: vectorisation off).
_CAPABILITY_CHOICES: dict[str, tuple[str, ...] | None] = {
    "default": None,
    "avx2": ("avx2",),
    "avx512": ("amx", "avx512_vnni", "avx512"),
    "vsx": ("vsx",),
    "zvector": ("zvector",),
}


def _flags(cpuinfo: str) -> set[str]:
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features", "features"):
            return set(value.split())
    return set()


def supported_isas(cpuinfo: str, machine: str, sve_vector_bytes: int | None = None) -> list[str]:
    """Every vector ISA Inductor would accept on this CPU, best first (Inductor's order)."""
    flags = _flags(cpuinfo)
    if machine in X86_MACHINES:
        found = []
        avx512 = flags >= _AVX512
        if avx512 and {"avx512_vnni", "amx_tile"} <= flags:
            found.append("amx")
        if avx512 and "avx512_vnni" in flags:
            found.append("avx512_vnni")
        if avx512:
            found.append("avx512")
        if "avx2" in flags:
            found.append("avx2")
        return found
    if machine in ARM_MACHINES:
        if flags & {"sve", "sve2"} and "bf16" in flags:
            return ["sve128" if sve_vector_bytes == 16 else "sve256"]
        return ["asimd"]
    if machine == "ppc64le":
        return ["vsx"]
    if machine == "s390x":
        return ["zvector"] if "vxe" in flags else []
    return []


def isa_level(
    cpuinfo: str,
    machine: str,
    sve_vector_bytes: int | None = None,
    capability: str | None = None,
) -> str:
    """Inductor's pick for this CPU (`amx`, `avx512_vnni`, `avx2`, `sve256`, `asimd`, ...),
    with `ATEN_CPU_CAPABILITY` applied the way Inductor applies it."""
    found = supported_isas(cpuinfo, machine, sve_vector_bytes)
    if not found:
        return "default"
    if capability in _CAPABILITY_CHOICES:
        choices = _CAPABILITY_CHOICES[capability]
        if choices is None:
            return "default"
        for name in found:
            if name in choices:
                return name
    return found[0]


def from_inductor_class(class_name: str, bit_width: int | None = None) -> str:
    """Our name for the VecISA instance Inductor picked (reported by the probe)."""
    if class_name == "VecSVE":
        class_name = f"VecSVE{bit_width or 256}"
    return INDUCTOR_CLASSES.get(class_name, f"unknown:{class_name}")


def _sve_vector_bytes() -> int | None:
    try:
        return int(SVE_VECTOR_LENGTH.read_text().strip())
    except (OSError, ValueError):
        return None


def detect() -> tuple[str, str | None]:
    """(Inductor's ISA on this host, the ATEN_CPU_CAPABILITY override or None)."""
    try:
        text = CPUINFO.read_text(encoding="utf-8", errors="replace")
    except OSError:
        text = ""
    override = os.environ.get("ATEN_CPU_CAPABILITY") or None
    machine = platform.machine()
    return isa_level(text, machine, _sve_vector_bytes(), override), override
