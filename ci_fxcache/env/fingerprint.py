"""The environment fingerprint: everything that decides whether compiled code can be reused.

Collected without importing torch: the target interpreter reads package metadata and parses
`torch/version.py`; GPUs come from nvidia-smi, the CUDA driver (libcuda.so.1) or rocminfo; the
CPU ISA from /proc/cpuinfo.
"""

from __future__ import annotations

import os
import platform
import sys
from dataclasses import asdict, dataclass, field
from typing import Any

from ci_fxcache import gha
from ci_fxcache.env import cpu, gpus
from ci_fxcache.errors import UsageError

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class Fingerprint:
    """One runner + interpreter + torch, as facts. `keyed_fields()` is what the scope key hashes."""

    torch_version: str
    torch_git_version: str
    cuda_version: str | None
    hip_version: str | None
    triton_version: str | None
    python_implementation: str
    python_version: str
    python_abi: str
    os: str
    machine: str
    gpus: tuple[gpus.Gpu, ...]
    driver_version: str | None
    cpu_isa: str
    cpu_capability_override: str | None
    salt: str = ""
    # Informational only: never part of the key.
    python_executable: str = ""
    torch_path: str = ""
    gpu_source: str = "none"
    schema: int = field(default=SCHEMA_VERSION)

    @property
    def device_kind(self) -> str:
        """`cuda` for CUDA builds, `rocm` for HIP builds, `cpu` otherwise."""
        if self.hip_version:
            return "rocm"
        if self.cuda_version:
            return "cuda"
        return "cpu"

    @property
    def gpu_archs(self) -> tuple[str, ...]:
        """Sorted distinct architectures of the visible GPUs that this torch build can use."""
        if self.device_kind == "cpu":
            return ()
        return tuple(sorted({g.arch for g in self.gpus}))

    @property
    def gpu_models(self) -> tuple[str, ...]:
        """Sorted distinct models of the visible GPUs (`gpus.model`): torch's FX graph key
        holds the device name (and on AMD the full gcnArchName), so does the scope."""
        if self.device_kind == "cpu":
            return ()
        return tuple(sorted({gpus.model(g) for g in self.gpus}))

    def keyed_fields(self) -> dict[str, Any]:
        """The fields that can change compiled code; the scope key hashes exactly these.

        `gpu_models` is keyed for GPU builds only, so CPU scopes keep their keys; the CPU ISA
        is keyed for every build, because torch's FX graph key does not hold it (see
        docs/scope-key.md: a GPU build's scope also holds its CPU compiles)."""
        return {
            "torch_version": self.torch_version,
            "torch_git_version": self.torch_git_version,
            "cuda_version": self.cuda_version,
            "hip_version": self.hip_version,
            "triton_version": self.triton_version,
            "python_abi": self.python_abi,
            "os": self.os,
            "machine": self.machine,
            "gpu_archs": list(self.gpu_archs),
            **({"gpu_models": list(self.gpu_models)} if self.device_kind != "cpu" else {}),
            "cpu_isa": self.cpu_isa,
            "cpu_capability_override": self.cpu_capability_override,
            "salt": self.salt,
        }

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (GPUs as a list of objects)."""
        data = asdict(self)
        data["gpus"] = [asdict(g) for g in self.gpus]
        data["device_kind"] = self.device_kind
        data["gpu_archs"] = list(self.gpu_archs)
        data["gpu_models"] = list(self.gpu_models)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Fingerprint:
        """Inverse of `to_dict` (extra keys ignored); UsageError on a malformed document."""
        names = {f for f in cls.__dataclass_fields__}
        try:
            values = {k: v for k, v in data.items() if k in names}
            values["gpus"] = tuple(gpus.Gpu(**g) for g in data.get("gpus", []))
            return cls(**values)
        except TypeError as exc:
            raise UsageError(f"malformed fingerprint document: {exc}") from exc


def python_abi_tag(implementation: str, version: str, abiflags: str, gil_disabled: bool) -> str:
    """Wheel-style interpreter tag: cp311, cp313t, pp310."""
    short = {"cpython": "cp", "pypy": "pp"}.get(implementation, implementation[:2])
    major, minor = version.split(".")[:2]
    tag = f"{short}{major}{minor}"
    if gil_disabled and not tag.endswith("t"):
        tag += "t"
    return tag + ("d" if "d" in abiflags else "")


def from_interpreter_report(
    report: dict[str, Any], python: str, inventory: gpus.GpuInventory, salt: str
) -> Fingerprint:
    """Build the fingerprint from the version reader's JSON and the host facts."""
    if report.get("error"):
        raise UsageError(f"--python {python}: {report['error']}")
    versions = report.get("torch_version_py")
    if report.get("torch_path") is None or versions is None:
        raise UsageError(
            f"torch is not installed for {python}; install torch there, or pass the "
            "interpreter that has it (--python or FXCACHE_PYTHON)"
        )
    if not versions.get("__version__"):
        raise UsageError(f"{report['torch_path']}/version.py has no __version__: broken torch?")
    isa, override = cpu.detect()
    fp = Fingerprint(
        torch_version=str(versions["__version__"]),
        torch_git_version=str(versions.get("git_version") or "unknown"),
        cuda_version=versions.get("cuda"),
        hip_version=versions.get("hip"),
        triton_version=report.get("triton_version"),
        python_implementation=report["python_implementation"],
        python_version=report["python_version"],
        python_abi=python_abi_tag(
            report["python_implementation"],
            report["python_version"],
            report.get("python_abiflags", ""),
            bool(report.get("python_gil_disabled")),
        ),
        os=sys.platform if sys.platform != "linux2" else "linux",
        machine=platform.machine(),
        gpus=inventory.gpus,
        driver_version=inventory.driver_version,
        cpu_isa=isa,
        cpu_capability_override=override,
        salt=salt.strip(),
        python_executable=report.get("python_executable") or python,
        torch_path=report["torch_path"],
        gpu_source=inventory.source,
    )
    warning = gpus.missing_gpu_warning(fp.device_kind, inventory)
    if warning:
        gha.warn(warning)
    return fp


def default_salt() -> str:
    """The user's salt from FXCACHE_KEY_SALT (empty when unset)."""
    return os.environ.get("FXCACHE_KEY_SALT", "")


def collect(python: str, salt: str | None = None) -> Fingerprint:
    """Fingerprint the target interpreter `python` on this host, without importing torch."""
    from ci_fxcache.env.pending_fingerprint import Pending

    return Pending(python, salt).result()
