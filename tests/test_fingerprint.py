"""Fingerprint: real torch read without import, cross-checked by --probe; GPUs, CPU ISA."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from ci_fxcache.env import cpu, gpus
from ci_fxcache.env.fingerprint import python_abi_tag
from tests.conftest import TORCH_PYTHON, RunFxcache, torch_build


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
    # The pinned torch in whichever build pip brought: `2.13.0+cpu`, or `2.13.0+cu130`.
    assert fp["torch_version"] == torch_facts["v"] and fp["torch_version"].startswith("2.13.0")
    assert fp["torch_git_version"] == torch_facts["git"]
    assert fp["cuda_version"] == torch_facts["cuda"] and fp["hip_version"] is None
    assert fp["python_abi"] == torch_facts["abi"]
    assert fp["device_kind"] == ("cuda" if torch_facts["cuda"] else "cpu")
    if not torch_facts["cuda"]:
        assert fp["gpu_archs"] == []  # a CPU build cannot use a GPU, seen or not
    assert fp["os"] == "linux" and fp["machine"] in ("x86_64", "aarch64")
    assert fp["cpu_isa"] in cpu.ISA_NAMES


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
    assert {
        "torch_version",
        "torch_git_version",
        "cuda_version",
        "triton_version",
        "cpu_isa",
    } <= fields


def test_probe_agrees_under_aten_cpu_capability(run_fxcache: RunFxcache) -> None:
    # "default" turns Inductor's vectorisation off on every CPU kind: both sides must say so.
    env = {"ATEN_CPU_CAPABILITY": "default"}
    proc = run_fxcache(
        "fingerprint", "--probe", "--json", "--python", TORCH_PYTHON, env=env, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["fingerprint"]["cpu_isa"] == "default"
    assert {"field": "cpu_isa", "ok": True} in [
        {"field": f["field"], "ok": f["ok"]} for f in doc["probe"]["fields"]
    ]


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
    # A CPU build of torch: GPUs are reported but cannot change its compiled code; a CUDA
    # build compiles for them, so their architectures are keyed.
    assert fp["gpu_archs"] == (["sm80", "sm90"] if torch_build().cuda else [])
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


# Flag sets as /proc/cpuinfo shows them on each kind (trimmed to the ISA-relevant part, plus
# neighbours that must not matter). The expected values follow Inductor's selection rules, which
# live once in ci_fxcache.env.cpu (x86: AMX > AVX-512 VNNI > AVX-512 > AVX2; aarch64: SVE with BF16
# at
# the kernel's vector length, else NEON).
_X86_BASE = "fpu sse sse2 ssse3 sse4_1 sse4_2 avx f16c fma bmi1 bmi2 avx2"
_AVX512 = "avx512f avx512dq avx512cd avx512bw avx512vl"
CPU_KINDS = [
    # (kind, machine, flags, SVE vector bytes, Inductor's pick)
    (
        "Intel Sapphire Rapids (AMX)",
        "x86_64",
        f"{_X86_BASE} {_AVX512} avx512_bf16 avx512_vnni avx512_fp16 amx_bf16 amx_tile amx_int8",
        None,
        "amx",
    ),
    (
        "Intel Ice Lake-SP",
        "x86_64",
        f"{_X86_BASE} {_AVX512} avx512ifma avx512vbmi avx512_vnni",
        None,
        "avx512_vnni",
    ),
    ("Intel Skylake-SP", "x86_64", f"{_X86_BASE} {_AVX512}", None, "avx512"),
    ("AMD Zen 3 (EPYC Milan)", "x86_64", f"{_X86_BASE} sse4a abm", None, "avx2"),
    (
        "AMD Zen 4 (EPYC Genoa)",
        "x86_64",
        f"{_X86_BASE} {_AVX512} avx512ifma avx512_bf16 avx512vbmi avx512_vnni avx512_bitalg",
        None,
        "avx512_vnni",
    ),
    (
        "AMD Zen 5 (EPYC Turin)",
        "x86_64",
        f"{_X86_BASE} {_AVX512} avx512_bf16 avx512_vnni avx_vnni avx512_vp2intersect",
        None,
        "avx512_vnni",
    ),
    ("x86 without AVX2", "x86_64", "fpu sse sse2 sse4_2 avx", None, "default"),
    ("AVX-512F alone (Knights Landing)", "x86_64", f"{_X86_BASE} avx512f avx512cd", None, "avx2"),
    (
        "AWS Graviton 2 (Neoverse N1)",
        "aarch64",
        "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm "
        "lrcpc dcpop asimddp ssbs",
        None,
        "asimd",
    ),
    (
        "AWS Graviton 3 (Neoverse V1)",
        "aarch64",
        "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm "
        "jscvt fcma lrcpc dcpop sha3 sm3 sm4 asimddp sha512 sve asimdfhm dit uscat ilrcpc "
        "flagm ssbs paca pacg dcpodp svei8mm svebf16 i8mm bf16 dgh rng",
        32,
        "sve256",
    ),
    (
        "AWS Graviton 4 (Neoverse V2)",
        "aarch64",
        "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm "
        "jscvt fcma lrcpc dcpop sha3 asimddp sha512 sve asimdfhm dit uscat ilrcpc flagm ssbs "
        "sb paca pacg dcpodp sve2 sveaes svepmull svebitperm svesha3 flagm2 frint svei8mm "
        "svebf16 i8mm bf16 dgh rng bti",
        16,
        "sve128",
    ),
    (
        "NVIDIA Grace (Neoverse V2)",
        "aarch64",
        "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm jscvt fcma "
        "lrcpc dcpop sha3 asimddp sha512 sve asimdfhm sve2 svebf16 i8mm bf16",
        16,
        "sve128",
    ),
    ("SVE without BF16 (A64FX)", "aarch64", "fp asimd evtstrm sha1 sha2 crc32 sve", 64, "asimd"),
    ("POWER9", "ppc64le", "", None, "vsx"),
]


@pytest.mark.parametrize(
    ("flags", "machine", "sve_bytes", "expected"),
    [pytest.param(f, m, v, e, id=k) for k, m, f, v, e in CPU_KINDS],
)
def test_cpu_isa_of_each_cpu_kind(
    flags: str, machine: str, sve_bytes: int | None, expected: str
) -> None:
    key = "Features" if machine == "aarch64" else "flags"
    cpuinfo = f"processor\t: 0\n{key}\t\t: {flags}\n"
    assert cpu.isa_level(cpuinfo, machine, sve_bytes) == expected
    assert expected in cpu.ISA_NAMES


@pytest.mark.parametrize(
    ("capability", "expected"),
    [
        ("default", "default"),  # vectorisation off
        ("avx2", "avx2"),
        ("avx512", "amx"),  # Inductor picks the best AVX-512 flavour for "avx512"
        ("zvector", "amx"),  # a value this CPU cannot honour is ignored
        ("bogus", "amx"),
    ],
)
def test_aten_cpu_capability_applied_like_inductor(capability: str, expected: str) -> None:
    spr = next(f for k, _, f, _, _ in CPU_KINDS if k.startswith("Intel Sapphire"))
    assert cpu.isa_level(f"flags : {spr}\n", "x86_64", None, capability) == expected
    zen3 = next(f for k, _, f, _, _ in CPU_KINDS if k.startswith("AMD Zen 3"))
    assert cpu.isa_level(f"flags : {zen3}\n", "x86_64", None, "avx512") == "avx2"


@pytest.mark.parametrize(
    ("class_name", "bits", "expected"),
    [
        ("VecAMX", 512, "amx"),
        ("VecAVX512VNNI", 512, "avx512_vnni"),
        ("VecAVX512", 512, "avx512"),
        ("VecAVX2", 256, "avx2"),
        ("VecNEON", 128, "asimd"),
        ("VecSVE", 128, "sve128"),
        ("VecSVE", 256, "sve256"),
        ("VecSVE256", 256, "sve256"),  # torch <= 2.7 named the class by its width
        ("InvalidVecISA", None, "default"),
    ],
)
def test_probe_names_inductor_classes(class_name: str, bits: int | None, expected: str) -> None:
    assert cpu.from_inductor_class(class_name, bits) == expected


def test_probe_never_calls_an_unknown_isa_default() -> None:
    assert cpu.from_inductor_class("VecRVV", 256) == "unknown:VecRVV"


def test_abi_tags() -> None:
    assert python_abi_tag("cpython", "3.11.7", "", False) == "cp311"
    assert python_abi_tag("cpython", "3.13.1", "t", True) == "cp313t"
    assert python_abi_tag("pypy", "3.10.14", "", False) == "pp310"
