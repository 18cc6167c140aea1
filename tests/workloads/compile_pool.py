"""A user workload that starts Inductor's compile worker pool the way a GPU compile does.

On CUDA or XPU inputs, compile_fx() calls `AsyncCompile.wakeup()` (torch/_inductor/compile_fx.py)
before compiling; a CPU-only machine never reaches that line, so this model makes the same call
itself on every run. With compile_threads <= 1 the call starts nothing, as on a GPU.
"""

from __future__ import annotations

from typing import Any

import torch


@torch._dynamo.disable
def _wake_compile_pool() -> None:
    from torch._inductor.async_compile import AsyncCompile

    AsyncCompile.wakeup()
    # Until a worker has answered: the pool is then there to be counted however soon the
    # phase ends (its sidecar imports torch first, seconds; a compile that checks nothing
    # else, such as the CPU's vector instructions, can end before it).
    wait = getattr(AsyncCompile, "wait_pool_ready", None)
    if wait is not None:
        wait()


def _fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    _wake_compile_pool()
    return x.sin() @ y


def sin_matmul(dtype: torch.dtype, device: str) -> dict[str, Any]:
    """`x.sin() @ y` on 64x64, waking the compile pool on each call."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(64, 64, generator=gen).to(device=device, dtype=dtype)
    y = torch.randn(64, 64, generator=gen).to(device=device, dtype=dtype)
    return {"model": _fn, "inputs": (x, y)}


def sin_matmul_b(dtype: torch.dtype, device: str) -> dict[str, Any]:
    """The same, as a second workload (two combinations run at once)."""
    return sin_matmul(dtype, device)
