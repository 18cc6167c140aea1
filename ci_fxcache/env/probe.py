"""`--probe`: import torch in the target interpreter and cross-check the no-import fingerprint."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ci_fxcache.env import cpu, gpus, interpreter
from ci_fxcache.env.fingerprint import Fingerprint

PROBE_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class FieldCheck:
    """One cross-checked field: what the fingerprint says and what torch says."""

    field: str
    fingerprint: Any
    torch: Any
    ok: bool


def _public(version: str | None) -> str | None:
    # pytorch-triton's distribution version carries a +git local tag that triton.__version__ lacks
    return None if version is None else re.sub(r"\+.*$", "", version)


def _identity(name: str, capability: str, arch: str) -> tuple[str, ...]:
    """What must agree about one GPU: the model name as the scope holds it, the capability
    (on AMD the full gcnArchName, `gfx90a:sramecc+:xnack-`) and the architecture."""
    return (gpus.model_name(name), capability, arch)


def compare(fp: Fingerprint, seen: dict[str, Any]) -> list[FieldCheck]:
    """Field-by-field comparison of the fingerprint with what `import torch` reported."""
    checks = [
        FieldCheck(name, getattr(fp, name), seen.get(name), getattr(fp, name) == seen.get(name))
        for name in ("torch_version", "torch_git_version", "cuda_version", "hip_version")
    ]
    fp_triton, torch_triton = fp.triton_version, seen.get("triton_version")
    checks.append(
        FieldCheck(
            "triton_version",
            fp_triton,
            torch_triton,
            fp_triton == torch_triton or _public(fp_triton) == _public(torch_triton),
        )
    )
    if fp.device_kind != "cpu":
        ours = [_identity(g.name, g.capability, g.arch) for g in fp.gpus]
        theirs = [_identity(g["name"], g["capability"], g["arch"]) for g in seen.get("gpus", [])]
        for index in range(max(len(ours), len(theirs))):
            mine = ours[index] if index < len(ours) else None
            other = theirs[index] if index < len(theirs) else None
            checks.append(FieldCheck(f"gpu[{index}]", mine, other, mine == other))
    if seen.get("cpu_isa_class"):
        isa = cpu.from_inductor_class(seen["cpu_isa_class"], seen.get("cpu_isa_bits"))
        checks.append(FieldCheck("cpu_isa", fp.cpu_isa, isa, fp.cpu_isa == isa))
    return checks


def run(fp: Fingerprint, python: str) -> list[FieldCheck]:
    """Import torch in `python` and compare every field it can tell."""
    seen = interpreter.run_snippet(
        interpreter.resolve(python), "probe_torch", timeout=PROBE_TIMEOUT_S
    )
    return compare(fp, seen)
