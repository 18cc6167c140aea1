"""Count Triton kernel compilations in this process.

Triton calls `triton.knobs.compilation.listener` at the end of every `triton.compile()`, with
`cache_hit=True` when the kernel came from Triton's cache and `cache_hit=False` when it ran the
compiler: the listener is Triton's own hook, so only real compilations are counted. Inductor
compiles Triton kernels in a pool of worker processes when `compile_threads > 1`, where no
listener of ours runs; `install(in_process=True)` turns the pool off for the phase that must
be counted (the hot phase: a complete hot load compiles nothing, so the pool only costs time).
"""

from __future__ import annotations

import time
from typing import Any

_BUILDS: list[str] = []
_T0 = [0.0]
_INSTALLED: list[bool] = []


def available() -> bool:
    """True when the installed Triton has the compilation listener."""
    try:
        from triton import knobs
    except Exception:  # no Triton (CPU-only torch) or a Triton older than its knobs
        return False
    return hasattr(getattr(knobs, "compilation", None), "listener")


def install(in_process: bool = False) -> bool:
    """Start counting (idempotent; chains to a listener already set); False without Triton.

    `in_process`: also compile Triton kernels in this process (see the module docstring)."""
    _BUILDS.clear()
    _T0[0] = time.perf_counter()
    if not available():
        return False
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


def evidence() -> dict[str, Any]:
    """The phase result's Triton fields (none when Triton cannot be counted here)."""
    if not _INSTALLED:
        return {}
    return {"triton_kernels_built": len(_BUILDS), "triton_kernel_builds": _BUILDS[:20]}
