"""GPUs seen without importing torch: stand-ins for nvidia-smi / rocminfo with real output shapes.

The stand-ins print the files under tests/data/gpu/ (captured shapes of `nvidia-smi -L`,
`nvidia-smi --query-gpu=... --format=csv,noheader,nounits` and ROCm 6 `rocminfo`, ISA Info
sections included) and, like the real tools, ignore CUDA_VISIBLE_DEVICES; the rocminfo stand-in
applies ROCR_VISIBLE_DEVICES as ROCr does.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from ci_fxcache.env import gpus
from tests.conftest import TORCH_PYTHON, RunFxcache

DATA = Path(__file__).parent / "data" / "gpu"
MIG_3G = "MIG-c6d4f1ef-42e4-5de3-91c7-45d71c87eb3f"


def nvidia_smi(tmp_path: Path, query: str = "nvidia-smi-query.csv") -> str:
    """A PATH whose nvidia-smi is the stand-in printing `query` for --query-gpu."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    tool = bin_dir / "nvidia-smi"
    tool.write_text(
        f"#!/bin/sh\nDATA='{DATA}'\nQUERY='{query}'\n. '{DATA}/nvidia_smi_standin.sh'\n"
    )
    tool.chmod(0o755)
    return f"{bin_dir}:{os.environ['PATH']}"


def rocminfo(tmp_path: Path) -> str:
    """A PATH whose rocminfo is the stand-in (and that has no nvidia-smi)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    tool = bin_dir / "rocminfo"
    tool.write_text(f"#!/bin/sh\nexec '{sys.executable}' '{DATA}/rocminfo_standin.py'\n")
    tool.chmod(0o755)
    return f"{bin_dir}:/usr/bin:/bin"


def detect(monkeypatch: pytest.MonkeyPatch, path: str, **env: str) -> gpus.GpuInventory:
    monkeypatch.setenv("PATH", path)
    return gpus.detect({"PATH": path, **env})


def summary(inventory: gpus.GpuInventory) -> list[tuple[int, str, str, str]]:
    return [(g.index, g.name, g.capability, g.arch) for g in inventory.gpus]


def test_all_gpus_without_visible_devices(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    inventory = detect(monkeypatch, nvidia_smi(tmp_path))
    assert [g.arch for g in inventory.gpus] == ["sm80", "sm90", "sm70", "sm60"]
    assert inventory.driver_version == "570.86.15" and inventory.source == "nvidia-smi"


def test_mig_slice_maps_to_its_parent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    inventory = detect(monkeypatch, nvidia_smi(tmp_path), CUDA_VISIBLE_DEVICES=MIG_3G)
    assert summary(inventory) == [(0, "NVIDIA A100-SXM4-80GB MIG 3g.40gb", "8.0", "sm80")]


def test_gpus_in_mig_mode_are_their_slices_when_nothing_selects(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As in a container given MIG slices and no CUDA_VISIBLE_DEVICES: CUDA sees the slices,
    # each with its profile (the scope holds it); an H100 in MIG mode without a slice gives none.
    inventory = detect(monkeypatch, nvidia_smi(tmp_path, "nvidia-smi-query-mig.csv"))
    assert summary(inventory) == [
        (0, "NVIDIA A100-SXM4-80GB MIG 3g.40gb", "8.0", "sm80"),
        (0, "NVIDIA A100-SXM4-80GB MIG 2g.20gb", "8.0", "sm80"),
        (0, "NVIDIA A100-SXM4-80GB MIG 1g.10gb", "8.0", "sm80"),
        (2, "Tesla V100-SXM2-32GB", "7.0", "sm70"),
        (3, "Tesla P100-PCIE-16GB", "6.0", "sm60"),
    ]


def test_legacy_mig_id_names_its_parent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    legacy = "MIG-GPU-5d5ba0d6-d33d-2b2c-524d-9e3d8d2b8a77/1/0"
    inventory = detect(monkeypatch, nvidia_smi(tmp_path), CUDA_VISIBLE_DEVICES=legacy)
    assert [(g.index, g.arch) for g in inventory.gpus] == [(0, "sm80")]


def test_visible_devices_keep_cuda_order_and_stop_at_an_invalid_entry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = nvidia_smi(tmp_path)
    # CUDA enumerates in the order given and ignores everything from the first bad entry on;
    # indices in PCI order, as nvidia-smi lists them (see test_gpu_driver for CUDA's default)
    ordered = detect(
        monkeypatch, path, CUDA_VISIBLE_DEVICES="1,GPU-9a8b,7,0", CUDA_DEVICE_ORDER="PCI_BUS_ID"
    )
    assert [g.arch for g in ordered.gpus] == ["sm90", "sm70"]
    assert "'7' names no device" in capsys.readouterr().err
    unknown_mig = detect(monkeypatch, path, CUDA_VISIBLE_DEVICES="MIG-00000000-dead,1")
    assert unknown_mig.gpus == ()
    assert "MIG-00000000-dead" in capsys.readouterr().err
    # a device named twice (here by index and by UUID) leaves CUDA no device at all
    twice = detect(
        monkeypatch, path, CUDA_VISIBLE_DEVICES="2,GPU-9a8b", CUDA_DEVICE_ORDER="PCI_BUS_ID"
    )
    assert twice.gpus == () and "twice" in capsys.readouterr().err


def test_unknown_compute_capability_keeps_the_device(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    inventory = detect(monkeypatch, nvidia_smi(tmp_path, "nvidia-smi-query-na.csv"))
    assert summary(inventory) == [
        (0, "GRID A100D-40C", "unknown", "unknown-GRID A100D-40C"),
        (1, "NVIDIA H100 80GB HBM3", "9.0", "sm90"),
    ]
    assert "no compute capability for GPU 0 (GRID A100D-40C" in capsys.readouterr().err


def _fake_gpu_torch(tmp_path: Path, cuda: str | None, hip: str | None) -> str:
    """A torch package whose version.py says it is a GPU build (its import is never needed)."""
    pkg = tmp_path / "site" / "torch"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise SystemExit('torch was imported')\n")
    (pkg / "version.py").write_text(
        f"__version__ = '2.13.0'\ngit_version = 'abc'\ncuda = {cuda!r}\nhip = {hip!r}\n"
    )
    return str(tmp_path / "site")


@pytest.mark.parametrize(
    ("query", "visible", "segment"),
    [
        ("nvidia-smi-query.csv", MIG_3G, "sm80"),
        ("nvidia-smi-query-na.csv", "0", "unknown_GRID_A100D_40C"),
    ],
)
def test_scope_key_of_a_cuda_build_names_the_device(
    run_fxcache: RunFxcache, tmp_path: Path, query: str, visible: str, segment: str
) -> None:
    env = {
        "PATH": nvidia_smi(tmp_path, query),
        "PYTHONPATH": _fake_gpu_torch(tmp_path, "12.8", None),
        "CUDA_VISIBLE_DEVICES": visible,
    }
    proc = run_fxcache("fingerprint", "--json", "--python", TORCH_PYTHON, env=env)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert "nogpu" not in doc["scope_key"]
    assert segment in doc["scope_key"], doc["scope_key"]


def test_rocminfo_agents_not_their_isa_names() -> None:
    # The capability is the full target torch's FX graph key holds (gcnArchName, features
    # included); the MI300X's second ISA, the generic gfx9-4-generic, is not its own.
    found = gpus.parse_rocminfo((DATA / "rocminfo.txt").read_text())
    assert [(g.index, g.name, g.capability, g.arch) for g in found] == [
        (0, "AMD Instinct MI250X", "gfx90a:sramecc+:xnack-", "gfx90a"),
        (1, "AMD Instinct MI250X", "gfx90a:sramecc+:xnack-", "gfx90a"),
        (2, "AMD Instinct MI300X", "gfx942:sramecc+:xnack-", "gfx942"),
    ]


@pytest.mark.parametrize(
    ("env", "names"),
    [
        ({}, ["gfx90a", "gfx90a", "gfx942"]),
        # rocminfo already applied ROCR_VISIBLE_DEVICES: applying it again would drop gfx942
        ({"ROCR_VISIBLE_DEVICES": "2"}, ["gfx942"]),
        ({"ROCR_VISIBLE_DEVICES": "GPU-b3a1c2d4e5f60718,0"}, ["gfx942", "gfx90a"]),
        # HIP's list indexes what ROCr left visible
        ({"ROCR_VISIBLE_DEVICES": "1,2", "HIP_VISIBLE_DEVICES": "1"}, ["gfx942"]),
        ({"CUDA_VISIBLE_DEVICES": "2,0"}, ["gfx942", "gfx90a"]),
        ({"HIP_VISIBLE_DEVICES": "2", "CUDA_VISIBLE_DEVICES": "0"}, ["gfx942"]),
        # HIP takes the agents' UUIDs too, and a repeated device leaves none
        ({"HIP_VISIBLE_DEVICES": "GPU-b3a1c2d4e5f60718"}, ["gfx942"]),
        ({"ROCR_VISIBLE_DEVICES": "1,2", "HIP_VISIBLE_DEVICES": "GPU-b3a1"}, ["gfx942"]),
        ({"HIP_VISIBLE_DEVICES": "0,0"}, []),
    ],
)
def test_rocm_visible_devices_applied_as_the_runtimes_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, env: dict[str, str], names: list[str]
) -> None:
    inventory = detect(monkeypatch, rocminfo(tmp_path), **env)
    assert inventory.source == "rocminfo"
    assert [g.arch for g in inventory.gpus] == names


def test_probe_compares_amd_gpus_by_gfx_name(run_fxcache: RunFxcache, tmp_path: Path) -> None:
    # A stand-in ROCm torch reporting what a real one reports for an MI250X GCD: capability
    # (9, 0) and gcnArchName with its target features.
    site = _fake_gpu_torch(tmp_path, None, "6.2.41133")
    (Path(site) / "torch" / "__init__.py").write_text(
        "from types import SimpleNamespace\n"
        "from . import version\n"
        "__version__ = version.__version__\n"
        "class cuda:\n"
        "    is_available = staticmethod(lambda: True)\n"
        "    device_count = staticmethod(lambda: 1)\n"
        "    get_device_capability = staticmethod(lambda i: (9, 0))\n"
        "    get_device_properties = staticmethod(lambda i: SimpleNamespace(\n"
        "        name='AMD Instinct MI250X', gcnArchName='gfx90a:sramecc+:xnack-'))\n"
    )
    env = {"PATH": rocminfo(tmp_path), "PYTHONPATH": site, "ROCR_VISIBLE_DEVICES": "0"}
    proc = run_fxcache("fingerprint", "--json", "--probe", "--python", TORCH_PYTHON, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    checks = {c["field"]: c for c in json.loads(proc.stdout)["probe"]["fields"]}
    assert checks["gpu[0]"]["ok"], checks["gpu[0]"]
