"""Fingerprint: real torch read without import, cross-checked by --probe; GPUs, CPU ISA."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from ci_fxcache import cpu, gpus
from ci_fxcache.fingerprint import python_abi_tag
from tests.conftest import TORCH_PYTHON, RunFxcache


@pytest.fixture(scope="module")
def torch_facts() -> dict[str, object]:
    """What `import torch` says, asked independently of fxcache."""
    code = (
        "import json, torch, sys; print(json.dumps({'v': torch.__version__, "
        "'git': torch.version.git_version, 'cuda': torch.version.cuda, "
        "'abi': 'cp%d%d' % sys.version_info[:2]}))"
    )
    out = subprocess.run([TORCH_PYTHON, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_fingerprint_json_matches_real_torch(
    run_fxcache: RunFxcache, torch_facts: dict[str, object]
) -> None:
    proc = run_fxcache("fingerprint", "--json", "--python", TORCH_PYTHON)
    assert proc.returncode == 0, proc.stderr
    fp = json.loads(proc.stdout)["fingerprint"]
    assert fp["torch_version"] == torch_facts["v"] == "2.13.0+cpu"
    assert fp["torch_git_version"] == torch_facts["git"]
    assert fp["cuda_version"] is None and fp["hip_version"] is None
    assert fp["python_abi"] == torch_facts["abi"]
    assert fp["device_kind"] == "cpu" and fp["gpu_archs"] == []
    assert fp["os"] == "linux" and fp["machine"] in ("x86_64", "aarch64")
    assert fp["cpu_isa"] in ("amx", "avx512", "avx2", "asimd", "sve", "default")


def test_fingerprint_never_imports_torch(run_fxcache: RunFxcache, tmp_path: Path) -> None:
    # A torch whose import would blow up: the fingerprint must not notice, the probe must.
    pkg = tmp_path / "site" / "torch"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise SystemExit('torch was imported')\n")
    (pkg / "version.py").write_text(
        "__version__ = '2.13.0+cu128'\ngit_version = 'abc'\ncuda = '12.8'\nhip = None\n"
    )
    env = {"PYTHONPATH": str(tmp_path / "site")}
    proc = run_fxcache("fingerprint", "--json", "--python", TORCH_PYTHON, env=env)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["fingerprint"]["cuda_version"] == "12.8"
    probed = run_fxcache("fingerprint", "--probe", "--python", TORCH_PYTHON, env=env)
    assert probed.returncode == 2 and "torch was imported" in probed.stderr


def test_probe_agrees_with_real_torch(run_fxcache: RunFxcache) -> None:
    proc = run_fxcache("fingerprint", "--probe", "--json", "--python", TORCH_PYTHON, timeout=300)
    assert proc.returncode == 0, proc.stderr
    probe = json.loads(proc.stdout)["probe"]
    assert probe["ok"] is True
    fields = {f["field"] for f in probe["fields"]}
    assert {"torch_version", "torch_git_version", "cuda_version", "triton_version"} <= fields


def test_probe_reports_mismatch_field_by_field(run_fxcache: RunFxcache, tmp_path: Path) -> None:
    # version.py says one thing, the imported torch another: a half-upgraded install.
    pkg = tmp_path / "site" / "torch"
    (pkg / "cuda").mkdir(parents=True)
    (pkg / "version.py").write_text(
        "__version__ = '2.12.0+cpu'\ngit_version = 'old'\ncuda = None\nhip = None\n"
    )
    (pkg / "__init__.py").write_text(
        "from types import SimpleNamespace\n"
        "__version__ = '2.13.0+cpu'\n"
        "version = SimpleNamespace(git_version='new', cuda=None, hip=None)\n"
        "from . import cuda\n"
    )
    (pkg / "cuda" / "__init__.py").write_text("def is_available():\n    return False\n")
    proc = run_fxcache(
        "fingerprint", "--probe", "--python", TORCH_PYTHON, env={"PYTHONPATH": str(pkg.parent)}
    )
    assert proc.returncode == 1
    assert "MISMATCH torch_version" in proc.stdout and "MISMATCH torch_git_version" in proc.stdout
    assert "ok       cuda_version" in proc.stdout
    assert "2.12.0+cpu" in proc.stderr and "2.13.0+cpu" in proc.stderr


NVIDIA_CSV = (
    "0, GPU-aaaa1111, NVIDIA H100 80GB HBM3, 9.0, 570.86.15\n"
    "1, GPU-bbbb2222, NVIDIA A100-SXM4-80GB, 8.0, 570.86.15\n"
)


def test_nvidia_smi_parsing() -> None:
    found, driver = gpus.parse_nvidia_smi(NVIDIA_CSV + "garbage line\n")
    assert [(g.index, g.arch, g.capability) for g, _ in found] == [
        (0, "sm90", "9.0"),
        (1, "sm80", "8.0"),
    ]
    assert driver == "570.86.15"


def test_gpus_from_fake_nvidia_smi_respect_visible_devices(
    run_fxcache: RunFxcache, fake_tools: Callable[[str, str], Path]
) -> None:
    bin_dir = fake_tools("nvidia-smi", f"cat <<'EOF'\n{NVIDIA_CSV}EOF\n")
    import os

    path = f"{bin_dir}:{os.environ['PATH']}"
    proc = run_fxcache("fingerprint", "--json", "--python", TORCH_PYTHON, env={"PATH": path})
    fp = json.loads(proc.stdout)["fingerprint"]
    assert [g["arch"] for g in fp["gpus"]] == ["sm90", "sm80"]
    assert fp["driver_version"] == "570.86.15" and fp["gpu_source"] == "nvidia-smi"
    # CPU build of torch: GPUs are reported but cannot change its compiled code.
    assert fp["gpu_archs"] == []
    only_second = run_fxcache(
        "fingerprint",
        "--json",
        "--python",
        TORCH_PYTHON,
        env={"PATH": path, "CUDA_VISIBLE_DEVICES": "GPU-bbbb"},
    )
    assert [g["name"] for g in json.loads(only_second.stdout)["fingerprint"]["gpus"]] == [
        "NVIDIA A100-SXM4-80GB"
    ]


def test_failing_nvidia_smi_warns_and_assumes_no_gpu(
    run_fxcache: RunFxcache, fake_tools: Callable[[str, str], Path]
) -> None:
    import os

    bin_dir = fake_tools(
        "nvidia-smi", "echo 'NVIDIA-SMI has failed: driver not loaded' >&2\nexit 9\n"
    )
    proc = run_fxcache(
        "fingerprint",
        "--json",
        "--python",
        TORCH_PYTHON,
        env={"PATH": f"{bin_dir}:{os.environ['PATH']}", "GITHUB_ACTIONS": "true"},
    )
    assert proc.returncode == 0
    assert "::warning::fxcache: " in proc.stderr and "driver not loaded" in proc.stderr
    assert json.loads(proc.stdout)["fingerprint"]["gpus"] == []  # stdout stays pure JSON


def test_hanging_nvidia_smi_times_out(
    monkeypatch: pytest.MonkeyPatch, fake_tools: Callable[[str, str], Path]
) -> None:
    import os

    bin_dir = fake_tools("nvidia-smi", "sleep 30\n")
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setattr(gpus, "TOOL_TIMEOUT_S", 0.5)
    inventory = gpus.detect()
    assert inventory.gpus == () and inventory.source == "none"


ROCMINFO = """
*******
Agent 1
*******
  Name:                    AMD EPYC 7763 64-Core Processor
  Marketing Name:          AMD EPYC 7763 64-Core Processor
  Device Type:             CPU
*******
Agent 2
*******
  Name:                    gfx90a
  Marketing Name:          AMD Instinct MI210
  Device Type:             GPU
*******
Agent 3
*******
  Name:                    gfx942
  Marketing Name:          AMD Instinct MI300X
  Device Type:             GPU
"""


def test_rocminfo_parsing() -> None:
    found = gpus.parse_rocminfo(ROCMINFO)
    assert [(g.index, g.arch, g.name) for g in found] == [
        (0, "gfx90a", "AMD Instinct MI210"),
        (1, "gfx942", "AMD Instinct MI300X"),
    ]


@pytest.mark.parametrize(
    ("flags", "machine", "expected"),
    [
        ("fpu avx2 fma avx512f avx512dq avx512vl avx512bw avx512_vnni amx_tile", "x86_64", "amx"),
        ("fpu avx2 fma avx512f avx512dq avx512vl avx512bw", "x86_64", "avx512"),
        ("fpu avx avx2 fma avx512f", "x86_64", "avx2"),
        ("fpu sse4_2", "x86_64", "default"),
    ],
)
def test_cpu_isa_levels(flags: str, machine: str, expected: str) -> None:
    assert cpu.isa_level(f"processor : 0\nflags\t\t: {flags}\n", machine) == expected


def test_cpu_isa_aarch64() -> None:
    assert cpu.isa_level("Features\t: fp asimd evtstrm sve\n", "aarch64") == "sve"
    assert cpu.isa_level("Features\t: fp asimd evtstrm\n", "aarch64") == "asimd"


def test_abi_tags() -> None:
    assert python_abi_tag("cpython", "3.11.7", "", False) == "cp311"
    assert python_abi_tag("cpython", "3.13.1", "t", True) == "cp313t"
    assert python_abi_tag("pypy", "3.10.14", "", False) == "pp310"
