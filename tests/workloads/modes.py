"""Tiny workloads for the compile-mode tests (tests/test_modes_compile.py): small enough that
max-autotune's benchmarks of Inductor's C++ GEMM templates take seconds on two loaded cores."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
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


def frozen_mlp_forget_tuning(dtype: torch.dtype, device: str) -> dict[str, Any]:
    """An inference MLP compiled with freezing, so the weights are constants and max-autotune
    benchmarks Inductor's C++ GEMM template against ATen on the CPU. With
    `FXCACHE_TEST_FAULT=forget-tuning` the hot process first removes the tuned choices from
    Inductor's local autotune cache (`<cache dir>/cache/`), as a scope restored without them
    would be: torch 2.13 bypasses the FX graph cache for frozen graphs, so the hot process
    compiles the graph again and, without its choices, benchmarks again, which verify must name."""
    if os.environ.get("FXCACHE_TEST_FAULT") == "forget-tuning":
        from torch._inductor.runtime.cache_dir_utils import cache_dir

        shutil.rmtree(Path(cache_dir()) / "cache", ignore_errors=True)
    # Set as users set it: torch 2.13 ignores `freezing` passed in torch.compile's options.
    torch._inductor.config.freezing = True
    model, x = _linear(dtype, device)
    return {
        "model": model,
        "inputs": (x,),
        "compile": {"options": {"max_autotune_gemm_backends": "CPP,ATEN"}},
    }
