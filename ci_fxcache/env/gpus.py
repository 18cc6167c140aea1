"""Visible GPUs, read from nvidia-smi or rocminfo without importing torch.

Which devices a process sees is decided by the runtimes' own variables, applied here as they
apply them: `CUDA_VISIBLE_DEVICES` on NVIDIA (indices, `GPU-` UUID prefixes, `MIG-` ids; the
list ends at the first entry that names no device); on AMD, `ROCR_VISIBLE_DEVICES` first (rocminfo
itself applies it), then `HIP_VISIBLE_DEVICES`, else `CUDA_VISIBLE_DEVICES`, as positions in what
ROCr left visible.
"""

from __future__ import annotations

import csv
import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ci_fxcache import gha

TOOL_TIMEOUT_S = 15.0
UNKNOWN_CAPABILITY = "unknown"
CUDA_VISIBLE = "CUDA_VISIBLE_DEVICES"
# The variables HIP reads, in the order it prefers them (ROCR_VISIBLE_DEVICES acts below HIP).
HIP_VISIBLE = ("HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")


@dataclass(frozen=True)
class Gpu:
    """One visible device: `arch` is `sm90` on NVIDIA, the gfx name (`gfx90a`) on AMD.

    A MIG slice is reported under its parent GPU's index and architecture, with the slice's
    profile in the name, as CUDA names it (`NVIDIA A100-SXM4-80GB MIG 3g.40gb`)."""

    index: int
    name: str
    capability: str
    arch: str


@dataclass(frozen=True)
class GpuInventory:
    """What the vendor tool reported: the devices, the driver and which tool answered."""

    gpus: tuple[Gpu, ...]
    driver_version: str | None
    source: str  # "nvidia-smi", "rocminfo" or "none"


def _run(argv: list[str], env: Mapping[str, str]) -> str | None:
    try:
        proc = subprocess.run(
            argv, capture_output=True, text=True, timeout=TOOL_TIMEOUT_S, check=False, env=env
        )
    except subprocess.TimeoutExpired:
        gha.warn(f"{argv[0]} did not answer within {TOOL_TIMEOUT_S:.0f} s; assuming no GPU")
        return None
    except OSError as exc:
        gha.warn(f"cannot run {argv[0]}: {exc.strerror}; assuming no GPU")
        return None
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        gha.warn(f"{argv[0]} failed (exit {proc.returncode}): {last}; assuming no GPU")
        return None
    return proc.stdout


def visible_list(env: Mapping[str, str], names: tuple[str, ...]) -> list[str] | None:
    """Entries of the first of `names` that is set in `env` (None when none is set)."""
    for name in names:
        value = env.get(name)
        if value is not None:
            return [v.strip() for v in value.split(",") if v.strip()]
    return None


def unknown_arch(name: str) -> str:
    """The architecture of a GPU whose compute capability the driver did not report: keyed by
    its model name, so two unknown models never share a scope."""
    return f"unknown-{name}"


def parse_nvidia_smi(text: str) -> tuple[list[tuple[Gpu, str]], str | None]:
    """Parse `--query-gpu=index,uuid,name,compute_cap,driver_version` CSV output.

    A `compute_cap` the driver cannot tell (`[N/A]`) keeps the device, with capability
    `unknown` and an architecture named after the model (see `unknown_arch`)."""
    found: list[tuple[Gpu, str]] = []
    driver = None
    for row in csv.reader(line for line in text.splitlines() if line.strip()):
        if len(row) < 5:
            continue
        index, uuid, name, cap, driver_version = (cell.strip() for cell in row[:5])
        if not index.isdigit():
            continue
        if re.fullmatch(r"\d+\.\d+", cap):
            major, minor = cap.split(".")
            gpu = Gpu(int(index), name, cap, f"sm{major}{minor}")
        else:
            gha.warn(
                f"nvidia-smi reports no compute capability for GPU {index} ({name}: {cap!r}); "
                "its cache is scoped by the model name instead (a newer driver reports it)"
            )
            gpu = Gpu(int(index), name, UNKNOWN_CAPABILITY, unknown_arch(name))
        found.append((gpu, uuid))
        driver = driver_version or driver
    return found, driver


_LIST_GPU = re.compile(r"^GPU (\d+): (.+?) \(UUID: (GPU-[^)]+)\)\s*$")
_LIST_MIG = re.compile(r"^\s+MIG (\S+)\s+Device\s+\d+: \(UUID: (MIG-[^)]+)\)\s*$")


def parse_nvidia_smi_list(text: str) -> dict[str, tuple[str, str]]:
    """MIG ids from `nvidia-smi -L`, each mapped to (parent GPU UUID, MIG profile).

    Both forms CUDA accepts are listed: `MIG-<uuid>` (R470 and later) and the older
    `MIG-GPU-<parent uuid>/<gi>/<ci>`, whose parent is in the id itself."""
    parents: dict[str, tuple[str, str]] = {}
    parent = None
    for line in text.splitlines():
        gpu = _LIST_GPU.match(line)
        if gpu:
            parent = gpu.group(3)
            continue
        mig = _LIST_MIG.match(line)
        if mig and parent:
            parents[mig.group(2)] = (parent, mig.group(1))
    return parents


def _resolve_cuda_entry(
    entry: str, found: list[tuple[Gpu, str]], migs: dict[str, tuple[str, str]]
) -> Gpu | None:
    """The device one CUDA_VISIBLE_DEVICES entry names, or None when it names none."""
    if entry.isdigit():
        return next((g for g, _ in found if g.index == int(entry)), None)
    profile = None
    parent_uuid = entry
    if entry.startswith("MIG-"):
        legacy = re.fullmatch(r"MIG-(GPU-[^/]+)/\d+/\d+", entry)
        if legacy:
            parent_uuid, profile = legacy.group(1), "MIG"
        elif entry in migs:
            parent_uuid, mig_profile = migs[entry]
            profile = f"MIG {mig_profile}"
        else:
            return None
    elif not entry.startswith("GPU-") or len(entry) <= len("GPU-"):
        return None
    matches = [g for g, uuid in found if uuid.startswith(parent_uuid)]
    if len(matches) != 1:  # CUDA wants a prefix that names exactly one GPU
        return None
    gpu = matches[0]
    return (
        gpu
        if profile is None
        else Gpu(gpu.index, f"{gpu.name} {profile}", gpu.capability, gpu.arch)
    )


def _nvidia(tool: str, env: Mapping[str, str]) -> GpuInventory | None:
    out = _run(
        [
            tool,
            "--query-gpu=index,uuid,name,compute_cap,driver_version",
            "--format=csv,noheader,nounits",
        ],
        env,
    )
    if out is None:
        return None
    found, driver = parse_nvidia_smi(out)
    visible = visible_list(env, (CUDA_VISIBLE,))
    if visible is None:
        return GpuInventory(tuple(g for g, _ in found), driver, "nvidia-smi")
    migs: dict[str, tuple[str, str]] = {}
    if any(v.startswith("MIG-") for v in visible):
        migs = parse_nvidia_smi_list(_run([tool, "-L"], env) or "")
    seen: list[Gpu] = []
    for entry in visible:
        gpu = _resolve_cuda_entry(entry, found, migs)
        if gpu is None:  # CUDA ignores this entry and every one after it
            gha.warn(
                f"{CUDA_VISIBLE}: {entry!r} names no device nvidia-smi lists; CUDA ignores it "
                "and every entry after it"
            )
            break
        seen.append(gpu)
    return GpuInventory(tuple(seen), driver, "nvidia-smi")


def parse_rocminfo(text: str) -> list[Gpu]:
    """GPU agents from `rocminfo` output, in the order ROCr enumerates them.

    An agent's own fields come first in its block; its `ISA Info` section repeats `Name:` with
    the full target triple (`amdgcn-amd-amdhsa--gfx90a:sramecc+:xnack-`), so the first
    occurrence of each field is the agent's."""
    gpus: list[Gpu] = []
    for block in re.split(r"\n\*{5,}\s*\nAgent \d+\s*\n\*{5,}", text)[1:]:
        fields: dict[str, str] = {}
        for line in block.splitlines():
            key, sep, value = line.partition(":")
            if sep:
                fields.setdefault(key.strip(), value.strip())
        if fields.get("Device Type") != "GPU":
            continue
        gfx = fields.get("Name", "")
        if not gfx.startswith("gfx"):
            continue
        gpus.append(Gpu(len(gpus), fields.get("Marketing Name") or gfx, gfx, gfx))
    return gpus


def _rocm(tool: str, env: Mapping[str, str]) -> GpuInventory | None:
    out = _run([tool], env)
    if out is None:
        return None
    gpus = parse_rocminfo(out)  # rocminfo already applied ROCR_VISIBLE_DEVICES
    visible = visible_list(env, HIP_VISIBLE)
    if visible is not None:  # positions in what ROCr left visible
        picked: list[Gpu] = []
        for entry in visible:
            if not entry.isdigit() or int(entry) >= len(gpus):
                gha.warn(f"{entry!r} in HIP's visible-devices list names no device rocminfo lists")
                break
            picked.append(gpus[int(entry)])
        gpus = picked
    driver_file = Path("/sys/module/amdgpu/version")
    driver = driver_file.read_text().strip() if driver_file.exists() else None
    return GpuInventory(tuple(gpus), driver, "rocminfo")


def detect(env: Mapping[str, str] | None = None) -> GpuInventory:
    """Ask nvidia-smi, else rocminfo; no tool (or a failing one) means no GPU."""
    environ = os.environ if env is None else env
    for name, reader in (("nvidia-smi", _nvidia), ("rocminfo", _rocm)):
        tool = shutil.which(name)
        if tool:
            inventory = reader(tool, environ)
            if inventory is not None:
                return inventory
    return GpuInventory((), None, "none")


def phase_slots(env: Mapping[str, str], count: int, hip: bool) -> tuple[str, list[str]]:
    """How to give one phase one of the `count` devices the parent sees: the variable to set
    in the phase's environment and one value per device, in torch's index order.

    The values are the parent's own entries (indices, UUIDs, MIG ids), so a phase never
    reaches a device the job was not given. On AMD they are positions in the list ROCr
    leaves visible; the phase inherits ROCR_VISIBLE_DEVICES unchanged."""
    names = HIP_VISIBLE if hip else (CUDA_VISIBLE,)
    for name in names:
        entries = visible_list(env, (name,))
        if entries is not None:
            return name, entries[:count]
    return names[0], [str(i) for i in range(count)]
