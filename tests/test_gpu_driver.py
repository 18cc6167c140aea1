"""A host without nvidia-smi is asked through the CUDA driver: a stub libcuda.so.1 built here.

The stub (tests/data/gpu/stub_libcuda.c) is compiled with the host's C compiler and found by the
dynamic loader through LD_LIBRARY_PATH, as a container's driver libraries are. A stand-in /dev
(a temporary directory) says whether the kernel exposes NVIDIA or AMD devices.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from ci_fxcache.env import fingerprint, gpus, scopekey
from tests.test_gpus import DATA, nvidia_smi

H200 = "NVIDIA H200|9|0"
H100 = "NVIDIA H100 80GB HBM3|9|0"


def libcuda_dir(lib_dir: Path) -> Path:
    """Build the stub libcuda.so.1 into `lib_dir` (skips the test without a C compiler)."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler (cc or gcc) on PATH to build the stub libcuda.so.1")
    lib_dir.mkdir(parents=True, exist_ok=True)
    library, source = lib_dir / "libcuda.so.1", DATA / "stub_libcuda.c"
    subprocess.run(
        [compiler, "-shared", "-fPIC", "-O1", "-o", str(library), str(source)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    return lib_dir


@pytest.fixture(scope="module")
def libcuda(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory holding the stub libcuda.so.1."""
    return libcuda_dir(tmp_path_factory.mktemp("libcuda"))


def dev_root(tmp_path: Path, *nodes: str) -> Path:
    root = tmp_path / "dev"
    root.mkdir(exist_ok=True)
    for node in nodes:
        (root / node).touch()
    return root


NO_SMI_PATH = "/usr/bin:/bin"  # no nvidia-smi, no rocminfo here


def test_no_nvidia_smi_asks_the_driver(tmp_path: Path, libcuda: Path) -> None:
    env = {
        "PATH": NO_SMI_PATH,
        "LD_LIBRARY_PATH": str(libcuda),
        "STUB_CUDA_DEVICES": f"{H200};NVIDIA GH200 480GB|9|0",
        # The driver applies it itself: fxcache must not apply it a second time.
        "CUDA_VISIBLE_DEVICES": "1",
    }
    inventory = gpus.detect(env, dev_root(tmp_path, "nvidiactl", "nvidia0"))
    assert inventory.source == "libcuda"
    assert [(g.index, g.name, g.capability, g.arch) for g in inventory.gpus] == [
        (0, "NVIDIA H200", "9.0", "sm90"),
        (1, "NVIDIA GH200 480GB", "9.0", "sm90"),
    ]


def test_the_driver_is_not_asked_without_nvidia_devices(tmp_path: Path, libcuda: Path) -> None:
    env = {"PATH": NO_SMI_PATH, "LD_LIBRARY_PATH": str(libcuda), "STUB_CUDA_DEVICES": H200}
    assert gpus.detect(env, dev_root(tmp_path)).source == "none"


def test_a_driver_that_fails_is_said_in_one_line(
    tmp_path: Path, libcuda: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    env = {
        "PATH": NO_SMI_PATH,
        "LD_LIBRARY_PATH": str(libcuda),
        "STUB_CUDA_DEVICES": H200,
        "STUB_CUDA_INIT": "100",  # CUDA_ERROR_NO_DEVICE
    }
    inventory = gpus.detect(env, dev_root(tmp_path, "nvidia0"))
    assert inventory.gpus == () and inventory.source == "none"
    err = capsys.readouterr().err
    assert "cuInit returned CUDA error 100" in err and len(err.strip().splitlines()) == 1


def test_no_libcuda_at_all_is_said(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    env = {"PATH": NO_SMI_PATH, "LD_LIBRARY_PATH": str(tmp_path)}
    inventory = gpus.detect(env, dev_root(tmp_path, "nvidia0"))
    assert inventory.gpus == ()
    assert "cannot load libcuda.so.1" in capsys.readouterr().err


def test_indices_on_a_mixed_host_follow_the_drivers_order(
    tmp_path: Path, libcuda: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """nvidia-smi lists PCI order (A100 first); CUDA's default order puts the fastest first.
    On a host of several models, an index means what the driver says it means."""
    base = {"PATH": nvidia_smi(tmp_path), "CUDA_VISIBLE_DEVICES": "0"}
    fastest_first = {**base, "LD_LIBRARY_PATH": str(libcuda), "STUB_CUDA_DEVICES": H100}
    inventory = gpus.detect(fastest_first)
    assert inventory.source == "libcuda"
    assert [g.name for g in inventory.gpus] == ["NVIDIA H100 80GB HBM3"]
    # PCI_BUS_ID: nvidia-smi's order is CUDA's; the driver is not needed
    pci = gpus.detect({**fastest_first, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"})
    assert pci.source == "nvidia-smi" and [g.arch for g in pci.gpus] == ["sm80"]
    capsys.readouterr()
    # no driver to ask: nvidia-smi's order, with a warning that names the fix
    unknown = gpus.detect({**base, "LD_LIBRARY_PATH": str(tmp_path)})
    assert [g.arch for g in unknown.gpus] == ["sm80"]
    assert "CUDA_DEVICE_ORDER=PCI_BUS_ID" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("kind", "nodes", "warned"),
    [
        ("cuda", ("nvidia0",), "/dev/nvidia0"),
        ("rocm", ("kfd",), "/dev/kfd"),
        ("cuda", (), None),  # no device node: a CPU runner, nothing to say
        ("cpu", ("nvidia0",), None),  # a CPU build cannot use the GPU anyway
    ],
)
def test_a_gpu_build_that_sees_no_gpu_beside_a_device_node_is_warned(
    tmp_path: Path, kind: str, nodes: tuple[str, ...], warned: str | None
) -> None:
    empty = gpus.GpuInventory((), None, "none")
    message = gpus.missing_gpu_warning(kind, empty, dev_root(tmp_path, *nodes))
    if warned is None:
        assert message is None
    else:
        assert message is not None and "\n" not in message
        assert message.replace(str(tmp_path), "").count(warned) == 1 and "nogpu" in message


def test_the_fingerprint_warns_once_and_keys_the_drivers_gpu(
    tmp_path: Path,
    libcuda: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A CUDA build of torch, no nvidia-smi: with the driver, the H200 is in the key; without
    it, one warning line beside `nogpu`."""
    monkeypatch.setattr(gpus, "DEV_ROOT", dev_root(tmp_path, "nvidiactl", "nvidia0"))
    report = {
        "python_implementation": "cpython",
        "python_version": "3.12.3",
        "torch_path": "/x/torch",
        "torch_version_py": {"__version__": "2.14.1+cu130", "git_version": "g", "cuda": "13.0"},
    }
    env = {"PATH": NO_SMI_PATH, "LD_LIBRARY_PATH": str(libcuda), "STUB_CUDA_DEVICES": H200}
    seen = fingerprint.from_interpreter_report(report, "python", gpus.detect(env), "")
    assert "-cu13.0-sm90-" in scopekey.scope_key(seen) and seen.gpu_models == ("nvidia_h200",)
    assert capsys.readouterr().err == ""
    env["STUB_CUDA_INIT"] = "999"
    blind = fingerprint.from_interpreter_report(report, "python", gpus.detect(env), "")
    assert "-cu13.0-nogpu-" in scopekey.scope_key(blind)
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 2, lines  # the driver's answer, then what it means for the scope
    assert "sees no GPU although" in lines[1] and "nvidia0" in lines[1]
