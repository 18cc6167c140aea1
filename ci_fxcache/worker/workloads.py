"""Built-in workloads and the loader for user factories (`package.module:factory`).

A factory is called as `factory(dtype=<torch.dtype>, device=<str>)` and returns either a dict
`{"model": callable, "inputs": tuple, "dynamic_inputs": tuple (optional)}` or a tuple
`(model, inputs[, dynamic_inputs])`. `dynamic_inputs` is a second set of inputs whose batch
dimension (dim 0) differs; dynamic combinations run it and it must not recompile.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn


class WorkloadError(Exception):
    """A user workload that cannot be imported or returns the wrong shape of thing."""


@dataclass
class Workload:
    """What a factory produced, normalised."""

    model: Any
    inputs: tuple[Any, ...]
    dynamic_inputs: tuple[Any, ...] | None


def _sin_matmul(dtype: torch.dtype, device: str) -> dict[str, Any]:
    def fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x.sin() @ y

    y = torch.rand(100, 100, dtype=dtype, device=device)
    return {
        "model": fn,
        "inputs": (torch.rand(64, 100, dtype=dtype, device=device), y),
        "dynamic_inputs": (torch.rand(40, 100, dtype=dtype, device=device), y),
    }


class _Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 64), nn.LayerNorm(64)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class _Conv(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.bn(self.conv(x))).mean(dim=(2, 3))


class _Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(32, 96)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, 4, 8).permute(2, 0, 3, 1, 4)
        out = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return out.transpose(1, 2).reshape(b, t, 32)


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(32)
        self.attn = _Attention()
        self.ln2 = nn.LayerNorm(32)
        self.mlp = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


def _module(cls: type[nn.Module], shape: tuple[int, ...], second: int):
    def factory(dtype: torch.dtype, device: str) -> dict[str, Any]:
        model = cls().to(device=device, dtype=dtype)
        return {
            "model": model,
            "inputs": (torch.randn(*shape, dtype=dtype, device=device),),
            "dynamic_inputs": (torch.randn(second, *shape[1:], dtype=dtype, device=device),),
        }

    return factory


BUILTINS: dict[str, Any] = {
    "sin_matmul": _sin_matmul,
    "mlp": _module(_Mlp, (32, 64), 20),
    "conv": _module(_Conv, (4, 3, 16, 16), 6),
    "attention": _module(_Attention, (2, 16, 32), 3),
    "transformer_block": _module(_Block, (2, 16, 32), 3),
}


def resolve(name: str) -> Any:
    """The factory for a built-in name or `package.module:attribute`."""
    if name in BUILTINS:
        return BUILTINS[name]
    module_name, _, attr = name.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise WorkloadError(
            f"workload {name}: cannot import {module_name} ({type(exc).__name__}: {exc}); "
            "it must be importable from the current directory or PYTHONPATH"
        ) from exc
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise WorkloadError(f"workload {name}: {module_name} has no callable {attr!r}")
    return factory


def _tensors(value: Any, what: str, name: str) -> tuple[Any, ...]:
    if isinstance(value, torch.Tensor):
        value = (value,)
    if not isinstance(value, (tuple, list)) or not value:
        raise WorkloadError(
            f"workload {name}: {what} must be a non-empty tuple of tensors, "
            f"got {type(value).__name__}"
        )
    if not any(isinstance(v, torch.Tensor) for v in value):
        raise WorkloadError(f"workload {name}: {what} holds no tensor")
    return tuple(value)


def build(name: str, dtype: torch.dtype, device: str) -> Workload:
    """Call the factory and check what it returned."""
    factory = resolve(name)
    try:
        made = factory(dtype=dtype, device=device)
    except WorkloadError:
        raise
    except Exception as exc:
        raise WorkloadError(
            f"workload {name}: the factory raised {type(exc).__name__}: {exc}"
        ) from exc
    if isinstance(made, dict):
        if "model" not in made or "inputs" not in made:
            raise WorkloadError(
                f"workload {name}: the factory returned a dict without 'model' and 'inputs' "
                f"(keys: {sorted(made)})"
            )
        model, inputs, second = made["model"], made["inputs"], made.get("dynamic_inputs")
    elif isinstance(made, (tuple, list)) and len(made) in (2, 3):
        model, inputs = made[0], made[1]
        second = made[2] if len(made) == 3 else None
    else:
        raise WorkloadError(
            f"workload {name}: the factory must return a dict with 'model' and 'inputs' or a "
            f"tuple (model, inputs[, dynamic_inputs]), got {type(made).__name__}"
        )
    if not callable(model):
        raise WorkloadError(f"workload {name}: 'model' is not callable ({type(model).__name__})")
    return Workload(
        model,
        _tensors(inputs, "inputs", name),
        None if second is None else _tensors(second, "dynamic_inputs", name),
    )
