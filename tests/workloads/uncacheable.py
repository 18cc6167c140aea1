"""User workloads with a part that torch's caches never store (`tests.workloads.uncacheable:...`).

`selective_checkpoint`: a block under selective activation checkpointing
(`torch.utils.checkpoint.checkpoint` with a `context_fn` made by
`create_selective_checkpoint_contexts`, as used to trade memory for compute in training).
AOTAutograd bypasses its cache for such a graph ("SAC context_fn does not have a cache_hash
attribute") in every process; the FX graph cache still stores its forward and backward graphs.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
)


def _policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
    if op == torch.ops.aten.mm.default:
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


class _Block(torch.nn.Module):
    def __init__(self, dtype: torch.dtype, device: str) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.rand(32, 32, dtype=dtype, device=device))

    def _inner(self, x: torch.Tensor) -> torch.Tensor:
        return (x @ self.w).sin()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        context = functools.partial(create_selective_checkpoint_contexts, _policy)
        return checkpoint(self._inner, x, use_reentrant=False, context_fn=context)


def selective_checkpoint(dtype: torch.dtype, device: str) -> dict[str, Any]:
    """The SAC block and a 16x32 input."""
    torch.manual_seed(0)
    return {
        "model": _Block(dtype, device),
        "inputs": (torch.rand(16, 32, dtype=dtype, device=device),),
    }
