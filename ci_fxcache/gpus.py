"""Visible GPUs, read from nvidia-smi or rocminfo without importing torch."""

from __future__ import annotations

import csv
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from ci_fxcache import gha

TOOL_TIMEOUT_S = 15.0


@dataclass(frozen=True)
class Gpu:
    """One visible device: `arch` is `sm90` on NVIDIA, the gfx name (`gfx90a`) on AMD."""

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


def _run(argv: list[str]) -> str | None:
    try:
        proc = subprocess.run(
            argv, capture_output=True, text=True, timeout=TOOL_TIMEOUT_S, check=False
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


def _visible(env_names: tuple[str, ...]) -> list[str] | None:
    for name in env_names:
        value = os.environ.get(name)
        if value is not None:
            return [v.strip() for v in value.split(",") if v.strip()]
    return None


def parse_nvidia_smi(text: str) -> tuple[list[tuple[Gpu, str]], str | None]:
    """Parse `--query-gpu=index,uuid,name,compute_cap,driver_version` CSV output."""
    found: list[tuple[Gpu, str]] = []
    driver = None
    for row in csv.reader(line for line in text.splitlines() if line.strip()):
        if len(row) < 5:
            continue
        index, uuid, name, cap, driver_version = (cell.strip() for cell in row[:5])
        if not index.isdigit() or not re.fullmatch(r"\d+\.\d+", cap):
            continue
        major, minor = cap.split(".")
        found.append((Gpu(int(index), name, cap, f"sm{major}{minor}"), uuid))
        driver = driver_version or driver
    return found, driver


def _nvidia(tool: str) -> GpuInventory | None:
    out = _run(
        [
            tool,
            "--query-gpu=index,uuid,name,compute_cap,driver_version",
            "--format=csv,noheader,nounits",
        ]
    )
    if out is None:
        return None
    found, driver = parse_nvidia_smi(out)
    visible = _visible(("CUDA_VISIBLE_DEVICES",))
    if visible is not None:  # indices or UUID prefixes, as the CUDA runtime accepts them
        found = [
            (g, uuid)
            for g, uuid in found
            if any(v == str(g.index) or (len(v) > 3 and uuid.startswith(v)) for v in visible)
        ]
    return GpuInventory(tuple(g for g, _ in found), driver, "nvidia-smi")


def parse_rocminfo(text: str) -> list[Gpu]:
    """GPU agents from `rocminfo` output (gfx name and marketing name)."""
    gpus: list[Gpu] = []
    for block in re.split(r"\n\*{5,}\s*\nAgent \d+\s*\n\*{5,}", text)[1:]:
        fields = dict(
            (k.strip(), v.strip())
            for k, _, v in (line.partition(":") for line in block.splitlines() if ":" in line)
        )
        if fields.get("Device Type") != "GPU":
            continue
        gfx = fields.get("Name", "")
        if not gfx.startswith("gfx"):
            continue
        gpus.append(Gpu(len(gpus), fields.get("Marketing Name") or gfx, gfx, gfx))
    return gpus


def _rocm(tool: str) -> GpuInventory | None:
    out = _run([tool])
    if out is None:
        return None
    gpus = parse_rocminfo(out)
    visible = _visible(("HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"))
    if visible is not None:
        gpus = [g for g in gpus if str(g.index) in visible]
    driver_file = Path("/sys/module/amdgpu/version")
    driver = driver_file.read_text().strip() if driver_file.exists() else None
    return GpuInventory(tuple(gpus), driver, "rocminfo")


def detect() -> GpuInventory:
    """Ask nvidia-smi, else rocminfo; no tool (or a failing one) means no GPU."""
    for name, reader in (("nvidia-smi", _nvidia), ("rocminfo", _rocm)):
        tool = shutil.which(name)
        if tool:
            inventory = reader(tool)
            if inventory is not None:
                return inventory
    return GpuInventory((), None, "none")
