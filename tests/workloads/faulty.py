"""User workloads (`tests.workloads.faulty:...`) for fault injection and the factory contract.

`sin_matmul` is `x.sin() @ y` as a user factory. `FXCACHE_TEST_FAULT=abort|hang` makes every
call of the model after the first in a process abort it or hang: the compiled calls of a phase,
as a broken cache would, not the eager warm-up every phase and the workload identity check
make first. Set it only for the phase that should fail (the factory itself stays well-behaved,
so the workload check before the matrix passes).
"""

from __future__ import annotations

import os
import time
from typing import Any

import torch

_CALLS = [0]


@torch._dynamo.disable
def _maybe_fault() -> None:
    _CALLS[0] += 1
    if _CALLS[0] == 1:
        return
    fault = os.environ.get("FXCACHE_TEST_FAULT")
    if fault == "abort":
        os.abort()
    if fault == "hang":
        time.sleep(3600)


def _fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    _maybe_fault()
    return x.sin() @ y


def sin_matmul(dtype: torch.dtype, device: str) -> dict[str, Any]:
    """A well-formed factory: dict with model, inputs and dynamic_inputs."""
    y = torch.rand(100, 100, dtype=dtype, device=device)
    return {
        "model": _fn,
        "inputs": (torch.rand(64, 100, dtype=dtype, device=device), y),
        "dynamic_inputs": (torch.rand(40, 100, dtype=dtype, device=device), y),
    }


def wrong_shape(dtype: torch.dtype, device: str) -> Any:
    """Returns a bare tensor instead of (model, inputs)."""
    return torch.zeros(3, dtype=dtype, device=device)


def no_tensors(dtype: torch.dtype, device: str) -> Any:
    """Returns (model, inputs) whose inputs hold no tensor."""
    return (_fn, (1, 2))


_EAGER_CALLS = [0]


@torch._dynamo.disable
def _first_call_noise() -> float:
    # The first call in the process is off by 1e-3, later ones are exact: an eager reference
    # that is not reproducible (the compiled call comes second, so it is exact).
    _EAGER_CALLS[0] += 1
    return 1e-3 if _EAGER_CALLS[0] == 1 else 0.0


def _flaky_fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return x.sin() @ y + _first_call_noise()


def flaky_eager(dtype: torch.dtype, device: str) -> dict[str, Any]:
    """sin_matmul whose first (eager) call in a process comes out slightly wrong."""
    return {
        "model": _flaky_fn,
        "inputs": (
            torch.rand(64, 100, dtype=dtype, device=device),
            torch.rand(100, 100, dtype=dtype, device=device),
        ),
    }


not_callable = 42


def hanging_factory(dtype: torch.dtype, device: str) -> Any:
    """A factory that never returns (a download that hangs, a lock never released)."""
    time.sleep(3600)


@torch._dynamo.disable
def _wake_compile_pool() -> None:
    from torch._inductor.async_compile import AsyncCompile

    AsyncCompile.wakeup()


def _pool_fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    _wake_compile_pool()
    _maybe_fault()
    return x.sin() @ y


def pool_sin_matmul(dtype: torch.dtype, device: str) -> dict[str, Any]:
    """`sin_matmul` that starts Inductor's compile worker pool (with compile_threads > 1 and a
    torch that ships Triton) on each call before the fault: a hang with workers running."""
    return {**sin_matmul(dtype, device), "model": _pool_fn}
