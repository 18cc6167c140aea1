"""Visible GPUs, read from nvidia-smi, the CUDA driver or rocminfo without importing torch.

Which devices a process sees is decided by the runtimes' own variables, applied as they apply
them (`ci_fxcache.env.visible`): `CUDA_VISIBLE_DEVICES` on NVIDIA, whose indices follow
`CUDA_DEVICE_ORDER`; on AMD, `ROCR_VISIBLE_DEVICES` first (rocminfo itself applies it), then
`HIP_VISIBLE_DEVICES`, else `CUDA_VISIBLE_DEVICES`. Without nvidia-smi (a container started with
`NVIDIA_DRIVER_CAPABILITIES=compute`), the driver itself is asked through `libcuda.so.1`, in a
process of its own; the driver applies both CUDA variables itself.
"""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ci_fxcache import gha, names
from ci_fxcache.env import snippets, visible

TOOL_TIMEOUT_S = 15.0
UNKNOWN_CAPABILITY = "unknown"
CUDA_VISIBLE = "CUDA_VISIBLE_DEVICES"
# The variables HIP reads, in the order it prefers them (ROCR_VISIBLE_DEVICES acts below HIP).
HIP_VISIBLE = ("HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")
CUDA_ORDER = "CUDA_DEVICE_ORDER"  # FASTEST_FIRST (CUDA's default) or PCI_BUS_ID (nvidia-smi's)
DEV_ROOT = Path("/dev")


@dataclass(frozen=True)
class Gpu:
    """One visible device: `arch` is `sm90` on NVIDIA, the gfx name (`gfx90a`) on AMD, where
    `capability` is the full target torch keys on (`gcnArchName`, `gfx90a:sramecc+:xnack-`).

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
    source: str  # "nvidia-smi", "libcuda", "rocminfo" or "none"


def model_name(name: str) -> str:
    """A GPU's model name as the scope key holds it: torch keys on the exact name the driver
    reports (`NVIDIA H100 80GB HBM3`, `NVIDIA H200`, `NVIDIA GH200 480GB`, a MIG slice with its
    profile); case, spacing and punctuation, which differ between nvidia-smi, the driver and
    rocminfo for one model, are folded (`nvidia_h100_80gb_hbm3`)."""
    return "_".join(re.findall(r"[0-9a-z]+", name.casefold())) or "unnamed"


def model(gpu: Gpu) -> str:
    """What the scope key holds for one device: its model name, and on AMD the full target
    (torch's FX graph key holds `gcnArchName` with its features, e.g. `:sramecc+:xnack-`)."""
    target = gpu.capability if gpu.arch.startswith("gfx") else ""
    return f"{model_name(gpu.name)}@{target}" if target else model_name(gpu.name)


def _run(argv: list[str], env: Mapping[str, str]) -> str | None:
    """A GPU tool's output (nvidia-smi, rocminfo, the driver query), or None (said in one
    line). It runs without any secret: whichever nvidia-smi PATH names is not ours."""
    try:
        proc = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=TOOL_TIMEOUT_S,
            check=False,
            env=names.without_secrets(env),
            stdin=subprocess.DEVNULL,
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


QUERY = "--query-gpu=index,uuid,name,compute_cap,driver_version,mig.mode.current"


def parse_nvidia_smi(text: str) -> tuple[list[tuple[Gpu, str]], str | None]:
    """Parse `--query-gpu=index,uuid,name,compute_cap,driver_version[,mig.mode.current]` CSV
    output.

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


def mig_enabled(text: str) -> set[str]:
    """UUIDs of the GPUs whose `mig.mode.current` (the query's sixth column) is Enabled."""
    rows = csv.reader(line for line in text.splitlines() if line.strip())
    return {r[1].strip() for r in rows if len(r) >= 6 and r[5].strip().lower() == "enabled"}


def with_mig_slices(
    found: Sequence[tuple[Gpu, str]], enabled: set[str], migs: dict[str, tuple[str, str]]
) -> list[Gpu]:
    """What CUDA sees when no variable selects: a GPU in MIG mode is not a device of its own,
    its MIG slices are (named with their profile, in `nvidia-smi -L` order); one in MIG mode
    without a slice gives none."""
    seen: list[Gpu] = []
    for gpu, uuid in found:
        if uuid not in enabled:
            seen.append(gpu)
            continue
        profiles = [profile for parent, profile in migs.values() if parent == uuid]
        seen += [replace(gpu, name=f"{gpu.name} MIG {profile}") for profile in profiles]
    return seen


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


def _mig_slice(
    entry: str, found: list[tuple[Gpu, str]], migs: dict[str, tuple[str, str]]
) -> tuple[int, Gpu] | None:
    """The MIG slice a `MIG-` id names, as (its parent's position, the slice), or None."""
    legacy = re.fullmatch(r"MIG-(GPU-[^/]+)/\d+/\d+", entry)
    if legacy:
        parent_uuid, profile = legacy.group(1), "MIG"
    elif entry in migs:
        parent_uuid, mig_profile = migs[entry]
        profile = f"MIG {mig_profile}"
    else:
        return None
    matches = [i for i, (_, uuid) in enumerate(found) if uuid.startswith(parent_uuid)]
    if len(matches) != 1:
        return None
    gpu = found[matches[0]][0]
    return matches[0], replace(gpu, name=f"{gpu.name} {profile}")


def cuda_order_known(env: Mapping[str, str], found: Sequence[tuple[Gpu, str]]) -> bool:
    """Whether nvidia-smi's order (PCI bus order) is the order CUDA's indices follow: with
    `CUDA_DEVICE_ORDER=PCI_BUS_ID`, or where every GPU is the same model (CUDA's default,
    FASTEST_FIRST, puts the fastest first and leaves the rest unspecified)."""
    if env.get(CUDA_ORDER, "").strip() == "PCI_BUS_ID":
        return True
    return len({(g.name, g.capability) for g, _ in found}) <= 1


def _nvidia(tool: str, env: Mapping[str, str]) -> GpuInventory | None:
    out = _run([tool, QUERY, "--format=csv,noheader,nounits"], env)
    if out is None:
        return None
    found, driver = parse_nvidia_smi(out)
    value = env.get(CUDA_VISIBLE)
    migs: dict[str, tuple[str, str]] = {}
    if value is None:
        enabled = mig_enabled(out)
        if not enabled:
            return GpuInventory(tuple(g for g, _ in found), driver, "nvidia-smi")
        migs = parse_nvidia_smi_list(_run([tool, "-L"], env) or "")
        return GpuInventory(tuple(with_mig_slices(found, enabled, migs)), driver, "nvidia-smi")
    entries = [e.strip() for e in value.split(",")]
    if any(visible.ordinal(e) >= 0 for e in entries) and not cuda_order_known(env, found):
        # Indices in CUDA's fastest-first order on a mixed host: only the driver knows them.
        driver_view = _libcuda(env)
        if driver_view is not None:  # the driver applied the order and the variable itself
            if not driver_view.gpus:
                gha.warn(f"{CUDA_VISIBLE}={value!r}: the CUDA driver sees no device under it")
            return GpuInventory(driver_view.gpus, driver, "libcuda")
        gha.warn(
            f"{CUDA_VISIBLE}={value!r} gives indices on a host with several GPU models and "
            f"{CUDA_ORDER} is not PCI_BUS_ID: read in nvidia-smi's (PCI) order, which CUDA may "
            f"not follow; set {CUDA_ORDER}=PCI_BUS_ID or use GPU UUIDs"
        )
    if any(e.startswith("MIG-") for e in entries):
        migs = parse_nvidia_smi_list(_run([tool, "-L"], env) or "")
    seen, problem = visible.cuda_visible(
        value,
        [g for g, _ in found],
        [uuid for _, uuid in found],
        lambda entry: _mig_slice(entry, found, migs),
    )
    if problem:
        gha.warn(problem)
    return GpuInventory(tuple(seen), driver, "nvidia-smi")


def parse_cuda_driver(report: dict[str, Any]) -> list[Gpu]:
    """Devices from the `cuda_driver` snippet's answer (CUDA's own order and names)."""
    found: list[Gpu] = []
    for device in report.get("devices") or []:
        cap = str(device.get("capability", ""))
        name = str(device.get("name", "")).strip()
        if re.fullmatch(r"\d+\.\d+", cap) and cap != "0.0":
            major, minor = cap.split(".")
            found.append(Gpu(int(device.get("index", len(found))), name, cap, f"sm{major}{minor}"))
        else:
            found.append(Gpu(len(found), name, UNKNOWN_CAPABILITY, unknown_arch(name)))
    return found


def cuda_driver_report(env: Mapping[str, str]) -> dict[str, Any] | None:
    """What the CUDA driver (libcuda.so.1) says, asked in a process of its own: the
    `cuda_driver` snippet's answer (`library`, `error`, `driver_api`, `devices`), or None when
    that process failed (said in one line)."""
    out = _run([sys.executable, "-I", "-c", snippets.source("cuda_driver")], env)
    if out is None:
        return None
    try:
        report = json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        report = None
    if not isinstance(report, dict):
        gha.warn("the CUDA driver query answered nonsense; assuming no GPU")
        return None
    return report


def _libcuda(env: Mapping[str, str]) -> GpuInventory | None:
    """The CUDA driver's view (None when it cannot be loaded or answers with an error)."""
    report = cuda_driver_report(env)
    if report is None:
        return None
    if report.get("error"):
        gha.warn(f"asked for its GPUs, the CUDA driver (libcuda.so.1) says: {report['error']}")
        return None
    return GpuInventory(tuple(parse_cuda_driver(report)), _nvidia_driver_version(), "libcuda")


def _nvidia_driver_version() -> str | None:
    try:
        return Path("/sys/module/nvidia/version").read_text().strip() or None
    except OSError:
        return None


def nvidia_devices_present(dev_root: Path | None = None) -> bool:
    """Whether the NVIDIA driver exposes devices under `dev_root` (default /dev):
    `nvidiactl`, `nvidia0`..."""
    root = DEV_ROOT if dev_root is None else dev_root
    return (root / "nvidiactl").exists() or any(root.glob("nvidia[0-9]*"))


def gpu_nodes(dev_root: Path | None = None) -> list[str]:
    """The GPU device nodes present under `dev_root` (default /dev): `nvidia0`, `kfd`."""
    root = DEV_ROOT if dev_root is None else dev_root
    return [str(root / n) for n in ("nvidia0", "kfd") if (root / n).exists()]


def missing_gpu_warning(
    device_kind: str, inventory: GpuInventory, dev_root: Path | None = None
) -> str | None:
    """One line when a GPU build of torch sees no GPU although the kernel exposes one
    (`/dev/nvidia0` or `/dev/kfd` under `dev_root`, default /dev)."""
    nodes = gpu_nodes(dev_root)
    if device_kind == "cpu" or inventory.gpus or not nodes:
        return None
    tools = "nvidia-smi or libcuda.so.1" if device_kind == "cuda" else "rocminfo"
    return (
        f"a {device_kind.upper()} build of torch sees no GPU although {' and '.join(nodes)} "
        f"exists: no working {tools} here (mount the driver's tools and libraries into the "
        "container); the scope is `nogpu`, shared with every such host"
    )


def _rocminfo_agents(text: str) -> list[tuple[Gpu, str]]:
    agents: list[tuple[Gpu, str]] = []
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
        # The first ISA is the agent's own target with its features (torch's gcnArchName).
        isa = re.search(rf"amdgcn-amd-amdhsa--({re.escape(gfx)}(?::[a-z0-9_-]+[+-])*)", block)
        target = isa.group(1) if isa else gfx
        gpu = Gpu(len(agents), fields.get("Marketing Name") or gfx, target, gfx)
        agents.append((gpu, fields.get("Uuid", "")))
    return agents


def parse_rocminfo(text: str) -> list[Gpu]:
    """GPU agents from `rocminfo` output, in the order ROCr enumerates them.

    An agent's own fields come first in its block; its `ISA Info` section repeats `Name:` with
    the full target triple (`amdgcn-amd-amdhsa--gfx90a:sramecc+:xnack-`), so the first
    occurrence of each field is the agent's, and the first ISA gives the full target."""
    return [g for g, _ in _rocminfo_agents(text)]


def _rocm(tool: str, env: Mapping[str, str]) -> GpuInventory | None:
    out = _run([tool], env)
    if out is None:
        return None
    agents = _rocminfo_agents(out)  # rocminfo already applied ROCR_VISIBLE_DEVICES
    variable = next((n for n in HIP_VISIBLE if env.get(n) is not None), HIP_VISIBLE[0])
    gpus, problem = visible.hip_visible(
        variable, env.get(variable), [g for g, _ in agents], [u for _, u in agents]
    )
    if problem:
        gha.warn(problem)
    driver_file = Path("/sys/module/amdgpu/version")
    driver = driver_file.read_text().strip() if driver_file.exists() else None
    return GpuInventory(tuple(gpus), driver, "rocminfo")


def detect(env: Mapping[str, str] | None = None, dev_root: Path | None = None) -> GpuInventory:
    """Ask nvidia-smi; without it, the CUDA driver where NVIDIA devices exist under
    `dev_root` (default /dev); else rocminfo. No answer (or a failing tool) means no GPU."""
    environ = os.environ if env is None else env
    tool = shutil.which("nvidia-smi", path=environ.get("PATH"))
    if tool:
        inventory = _nvidia(tool, environ)
        if inventory is not None:
            return inventory
    elif nvidia_devices_present(dev_root):
        inventory = _libcuda(environ)
        if inventory is not None:
            return inventory
    tool = shutil.which("rocminfo", path=environ.get("PATH"))
    if tool:
        inventory = _rocm(tool, environ)
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
