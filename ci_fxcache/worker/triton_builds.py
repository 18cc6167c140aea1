"""Count Triton kernel compilations (and Triton's own C builds) in this process.

Triton >= 3.4 calls `triton.knobs.compilation.listener` at the end of every `triton.compile()`,
with `cache_hit=True` when the kernel came from Triton's cache and `cache_hit=False` when it ran
the compiler: Triton's own hook, so only real compilations are counted. Inductor compiles Triton
kernels in a pool of worker processes when `compile_threads > 1`, where no listener of ours
runs; `install(in_process=True)` turns the pool off for the phase that must be counted (the hot
phase: a complete hot load compiles nothing, so the pool only costs time).

Older Triton (3.2 / 3.3, with torch 2.6 / 2.7) has no knobs: there the kernels are counted as
the new kernel binaries (`*.cubin`, `*.hsaco`, ...) that appear in `TRITON_CACHE_DIR` during the
phase, a compile writing each kernel's binary there once. That count is not possible when torch
itself wrote kernels there from a cache bundle during the phase (a mega-cache or precompile hot
load: `TritonBundler.read_and_emit`), and the phase says so (`triton_uncounted`).

Either way, Triton's C modules built by gcc into `TRITON_CACHE_DIR` (the driver's
`cuda_utils*.so` / `hip_utils*.so`, kernel launchers `__triton_launcher*.so`) are counted from the
same listing (`triton_driver_builds`): the listener does not see them.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

KERNEL_BINARIES = (".cubin", ".hsaco", ".spv", ".zebin")
DRIVER_MODULES = ("cuda_utils", "hip_utils", "__triton_launcher")
BUNDLER_COUNTER = "triton_bundler_read_and_emit_kernel"

_BUILDS: list[str] = []
_T0 = [0.0]
_INSTALLED: list[bool] = []
_STATE: dict[str, Any] = {}


def triton_version() -> str | None:
    """The importable Triton's version, or None without Triton."""
    try:
        import triton
    except Exception:
        return None
    return str(getattr(triton, "__version__", "unknown"))


def available() -> bool:
    """True when the installed Triton has the compilation listener (Triton >= 3.4)."""
    try:
        from triton import knobs
    except Exception:  # no Triton (CPU-only torch) or a Triton older than its knobs
        return False
    return hasattr(getattr(knobs, "compilation", None), "listener")


def _listing(cache_dir: Path | None) -> set[str]:
    """Files under `cache_dir` (relative paths) that a compile or a C build writes."""
    if cache_dir is None or not cache_dir.is_dir():
        return set()
    return {
        str(p.relative_to(cache_dir))
        for p in cache_dir.rglob("*")
        if p.name.endswith(KERNEL_BINARIES) or _is_driver(p.name)
    }


def _is_driver(name: str) -> bool:
    return name.endswith(".so") and name.startswith(DRIVER_MODULES)


def install(
    in_process: bool = False, cache_dir: Path | None = None, device: str | None = None
) -> bool:
    """Start counting (idempotent; chains to a listener already set); False without a listener.

    `in_process`: also compile Triton kernels in this process (see the module docstring).
    `cache_dir`: the phase's TRITON_CACHE_DIR, listed now and again in `evidence()`.
    `device`: a `cuda` phase also lists the cache dir and says when it cannot count; any other
    phase (a CPU phase compiles no Triton) reports the listener's count only."""
    _BUILDS.clear()
    _T0[0] = time.perf_counter()
    _STATE.clear()
    _STATE.update(cache_dir=cache_dir, before=_listing(cache_dir), device=device)
    version = triton_version()
    _STATE["version"] = version
    if not available():
        _STATE["mode"] = "cache-listing" if version is not None else None
        return False
    _STATE["mode"] = "listener"
    if in_process:
        import torch._inductor.config as inductor_config

        inductor_config.compile_threads = 1
    if _INSTALLED:
        return True
    from triton import knobs

    previous = knobs.compilation.listener

    def listener(**event: Any) -> None:
        if not event.get("cache_hit", True):
            name = getattr(event.get("src"), "name", "kernel")
            _BUILDS.append(f"triton {name} at {time.perf_counter() - _T0[0]:.1f}s")
        if previous is not None:
            previous(**event)

    knobs.compilation.listener = listener
    _INSTALLED.append(True)
    return True


def _bundled_kernels() -> int:
    try:
        from torch._dynamo.utils import counters
    except Exception:
        return 0
    return int(counters["inductor"].get(BUNDLER_COUNTER, 0))


def evidence() -> dict[str, Any]:
    """The phase result's Triton fields: the kernel count and how it was taken, or why there is
    none (`triton_uncounted`), and the C modules Triton built (`triton_driver_builds`)."""
    mode, version = _STATE.get("mode"), _STATE.get("version")
    if _STATE.get("device") != "cuda":
        if mode != "listener":
            return {}
        return {"triton_kernels_built": len(_BUILDS), "triton_kernel_builds": _BUILDS[:20]}
    new = sorted(_listing(_STATE.get("cache_dir")) - _STATE.get("before", set()))
    out: dict[str, Any] = {
        "triton_driver_builds": [Path(p).name for p in new if _is_driver(Path(p).name)][:20],
    }
    if mode == "listener":
        out.update(triton_count="listener", triton_kernels_built=len(_BUILDS))
        out["triton_kernel_builds"] = _BUILDS[:20]
    elif mode is None:
        out["triton_uncounted"] = "Triton builds not counted: no Triton importable in this phase"
    elif _bundled_kernels():
        out["triton_uncounted"] = (
            f"Triton builds not counted: Triton {version} has no compilation listener (3.4+), "
            "and torch wrote bundled kernels into TRITON_CACHE_DIR during this phase, so new "
            "kernel files there do not tell compiled from loaded"
        )
    else:
        kernels = [p for p in new if p.endswith(KERNEL_BINARIES)]
        out.update(triton_count="cache-listing", triton_kernels_built=len(kernels))
        out["triton_kernel_builds"] = [f"triton {p}" for p in kernels[:20]]
    return out
