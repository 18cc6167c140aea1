"""User workloads (`tests.workloads.ranked:...`) for `--ranks`: a small MLP, the same MLP
wrapped in DistributedDataParallel by its own factory, and faults on one rank.

`FXCACHE_TEST_RANK_FAULT=KIND:RANK` makes the factory, in the process of that rank (torch's
`RANK`, set for each rank of a phase), inject a fault: `tamper` makes the Inductor code that
process loads compute a wrong forward output (the first output of each forward graph gets +1,
gradients untouched, so its peers stay right: a corrupted entry that only this rank reads);
`hang` makes the factory sleep (its peers wait in their first collective). Set it only for the
phase that should fail: processes without a rank (the workload and identity checks) never
inject anything.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

FAULT_ENV = "FXCACHE_TEST_RANK_FAULT"


def _fault() -> str:
    kind, _, rank = os.environ.get(FAULT_ENV, "").partition(":")
    return kind if kind and os.environ.get("RANK") == rank else ""


def _tamper_loaded_code() -> None:
    """Wrap each forward graph Inductor loads in this process so its first output is +1."""
    from torch._inductor.codecache import PyCodeCache

    original = PyCodeCache.load_by_key_path.__func__  # type: ignore[attr-defined]

    def load(cls: Any, key: str, path: str, *args: Any, **kwargs: Any) -> Any:
        module = original(cls, key, path, *args, **kwargs)
        backward = "tangents_" in Path(path).read_text()
        if hasattr(module, "call") and not backward and not hasattr(module, "_fxcache_wrong"):
            call = module.call

            def wrong(inputs: Any) -> Any:
                outs = list(call(inputs))
                outs[0] = outs[0] + 1
                return outs

            module.call, module._fxcache_wrong = wrong, True
        return module

    PyCodeCache.load_by_key_path = classmethod(load)  # type: ignore[method-assign,assignment]


class _Mlp(nn.Module):
    """A forward of its own: under DDP, Dynamo breaks the graph at DDP's forward and compiles
    the wrapped module's frame, which it would skip for torch's own nn.Sequential."""

    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(16, 32), nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(x)))


def _mlp(dtype: torch.dtype, device: str) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    fault = _fault()
    if fault == "hang":
        time.sleep(3600)
    if fault == "tamper":
        _tamper_loaded_code()
    model = _Mlp().to(device=device, dtype=dtype)
    return model, (torch.randn(8, 16, dtype=dtype, device=device),)


def mlp(dtype: torch.dtype, device: str) -> dict[str, Any]:
    """A small MLP (the verifier wraps it in DistributedDataParallel on each rank)."""
    model, inputs = _mlp(dtype, device)
    return {"model": model, "inputs": inputs}


def ddp_mlp(dtype: torch.dtype, device: str) -> dict[str, Any]:
    """The same MLP, wrapped in DistributedDataParallel by the factory itself where a process
    group exists (as FSDP and DDP users' factories do); plain in a single process."""
    model, inputs = _mlp(dtype, device)
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        model = nn.parallel.DistributedDataParallel(model)
    return {"model": model, "inputs": inputs}
