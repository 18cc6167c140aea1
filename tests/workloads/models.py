"""User workloads for the verdict tests: real random models, a nondeterministic stand-in and a
recompile that only the hot phase sees (`tests.workloads.models:...`).

`FXCACHE_TEST_FAULT=jitter|jitter-second|eager-noise|recompile` turns the faults on; set it
only for the phase that should see them (the factories stay well-behaved, so the workload check
passes).
"""

from __future__ import annotations

import os
import time
from typing import Any

import torch
from torch import nn


class _DropoutMlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(64, 128), nn.GELU(), nn.Dropout(0.2), nn.Linear(128, 64), nn.Dropout(0.1)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def dropout_mlp(dtype: torch.dtype, device: str) -> dict[str, Any]:
    """An MLP with two `nn.Dropout` layers, in training mode (dropout active in every call)."""
    model = _DropoutMlp().to(device=device, dtype=dtype)
    return {
        "model": model,
        "inputs": (torch.randn(32, 64, dtype=dtype, device=device),),
        "dynamic_inputs": (torch.randn(20, 64, dtype=dtype, device=device),),
    }


# Seeded from the clock, not from torch.manual_seed: the noise differs in every call and every
# process, as the summation order of atomic adds on a GPU does.
_NOISE = torch.Generator().manual_seed(time.perf_counter_ns())


@torch._dynamo.disable
def _jitter(t: torch.Tensor) -> torch.Tensor:
    fault = os.environ.get("FXCACHE_TEST_FAULT")
    # jitter-second: only on the second input shape (batch 40), as a kernel whose atomics only
    # race at some sizes
    if fault != "jitter" and not (fault == "jitter-second" and t.shape[0] != 64):
        return t
    # at most ~1 float32 ulp of the outputs (|x.sin() @ y| is about 10-30): below the float32
    # tolerance, above bitwise equality
    noise = torch.rand(t.shape, generator=_NOISE, dtype=torch.float32) * 2e-6
    return t + noise.to(device=t.device, dtype=t.dtype)


def _jittery_fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return _jitter(x.sin() @ y)


def jittery(dtype: torch.dtype, device: str) -> dict[str, Any]:
    """`x.sin() @ y` whose result, with the jitter fault, changes by ~1 ulp from call to call:
    a stand-in for nondeterministic GPU kernels (atomic adds) on a CPU."""
    y = torch.rand(100, 100, dtype=dtype, device=device)
    return {
        "model": _jittery_fn,
        "inputs": (torch.rand(64, 100, dtype=dtype, device=device), y),
        "dynamic_inputs": (torch.rand(40, 100, dtype=dtype, device=device), y),
    }


_FLAGS = {"fast": True}


@torch._dynamo.disable
def _flip_on_second_shape(x: torch.Tensor) -> None:
    if os.environ.get("FXCACHE_TEST_FAULT") == "recompile" and x.shape[0] != 64:
        _FLAGS["fast"] = False


def _switching_fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    _flip_on_second_shape(x)
    # Both branches compute the same values; Dynamo guards on the flag, so flipping it makes
    # the next call recompile: a recompile that only the faulted (hot) process sees.
    if _FLAGS["fast"]:
        return x.sin() @ y
    return torch.sin(x).matmul(y)


def recompiles_when_faulted(dtype: torch.dtype, device: str) -> dict[str, Any]:
    """`x.sin() @ y` that, with the recompile fault, recompiles on the second input shape."""
    y = torch.rand(100, 100, dtype=dtype, device=device)
    return {
        "model": _switching_fn,
        "inputs": (torch.rand(64, 100, dtype=dtype, device=device), y),
        "dynamic_inputs": (torch.rand(40, 100, dtype=dtype, device=device), y),
    }


def _eager_noisy_fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    out = x.sin() @ y
    if os.environ.get("FXCACHE_TEST_FAULT") == "eager-noise" and not torch.compiler.is_compiling():
        # eager only (Dynamo traces the branch away): noise from the OS, far beyond the float32
        # tolerance, that no seed reproduces, as an eager kernel with racing atomics would give
        noise = torch.frombuffer(bytearray(os.urandom(out.numel())), dtype=torch.uint8)
        out = out + (noise.reshape(out.shape).to(out.dtype) / 255 - 0.5) * 0.02
    return out


def eager_noisy(dtype: torch.dtype, device: str) -> dict[str, Any]:
    """`x.sin() @ y` whose eager output, with the eager-noise fault, is not reproducible from a
    seed (the compiled one is): not a model that draws random numbers."""
    y = torch.rand(100, 100, dtype=dtype, device=device)
    return {
        "model": _eager_noisy_fn,
        "inputs": (torch.rand(64, 100, dtype=dtype, device=device), y),
        "dynamic_inputs": (torch.rand(40, 100, dtype=dtype, device=device), y),
    }


def records_determinism(dtype: torch.dtype, device: str) -> dict[str, Any]:
    """`x.sin() @ y`; appends to `$FXCACHE_TEST_RECORD` (when set) the determinism settings the
    factory found: torch's deterministic algorithms, Inductor's mode, cuBLAS's workspace."""
    record = os.environ.get("FXCACHE_TEST_RECORD")
    if record:
        import json

        import torch._inductor.config as inductor_config

        seen = {
            "algorithms": torch.are_deterministic_algorithms_enabled(),
            "inductor": bool(inductor_config.deterministic),
            "cublas": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
        }
        with open(record, "a") as f:
            f.write(json.dumps(seen) + "\n")
    y = torch.rand(100, 100, dtype=dtype, device=device)
    return {
        "model": lambda x, w: x.sin() @ w,
        "inputs": (torch.rand(64, 100, dtype=dtype, device=device), y),
    }
