"""Tiny workloads for the compile-mode tests (tests/test_modes_compile.py): small enough that
max-autotune's benchmarks of Inductor's C++ GEMM templates take seconds on two loaded cores."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


def _linear(dtype: torch.dtype, device: str) -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 16)).to(device, dtype)
    return model, torch.randn(8, 16, dtype=dtype, device=device)


def tiny_mlp(dtype: torch.dtype, device: str) -> dict[str, Any]:
    model, x = _linear(dtype, device)
    return {"model": model, "inputs": (x,)}


def tiny_mlp_options(dtype: torch.dtype, device: str) -> dict[str, Any]:
    """The same model, compiled with options a job passes (the factory contract's `compile`)."""
    model, x = _linear(dtype, device)
    return {
        "model": model,
        "inputs": (x,),
        "compile": {"fullgraph": True, "options": {"max_autotune_gemm_backends": "CPP,ATEN"}},
    }
