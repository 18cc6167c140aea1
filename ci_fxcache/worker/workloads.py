"""Built-in workloads and the loader for user factories (`package.module:factory`).

A factory is called as `factory(dtype=<torch.dtype>, device=<str>)` and returns either a dict
`{"model": callable, "inputs": tuple, "dynamic_inputs": tuple (optional)}` or a tuple
`(model, inputs[, dynamic_inputs])`. `dynamic_inputs` is a second set of inputs whose batch
dimension (dim 0) differs; dynamic combinations run it and it must not recompile. The dict may
also hold `compile`: the other arguments the job passes to `torch.compile` (`COMPILE_KEYS`:
`fullgraph`, `backend`, `options` such as `{"max_autotune_gemm_backends": "CPP"}`), applied
the same in every phase and part of the workload's identity (worker/identity.py); the mode and
the dynamic setting are the matrix's axes (--modes, --dynamic).
"""

from __future__ import annotations

import importlib
import json
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn


class WorkloadError(Exception):
    """A user workload that cannot be imported or returns the wrong shape of thing."""


# The torch.compile arguments a factory may name (`compile`), and the type each takes.
COMPILE_KEYS: dict[str, type | tuple[type, ...]] = {
    "fullgraph": bool,
    "backend": str,
    "options": dict,
}
# Named by the matrix, never by a factory: the axis that sets it.
AXIS_KEYS = {"mode": "--modes", "dynamic": "--dynamic"}


@dataclass
class Workload:
    """What a factory produced, normalised."""

    model: Any
    inputs: tuple[Any, ...]
    dynamic_inputs: tuple[Any, ...] | None
    # torch.compile's other arguments (COMPILE_KEYS), as the factory named them
    compile: dict[str, Any] = field(default_factory=dict)


def compile_options(value: Any, name: str) -> dict[str, Any]:
    """A factory's `compile` entry, checked: known keys, their types, JSON-like values (they
    enter the identity and the evidence)."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise WorkloadError(
            f"workload {name}: 'compile' must be a dict, got {type(value).__name__}"
        )
    for key, given in value.items():
        if key in AXIS_KEYS:
            raise WorkloadError(
                f"workload {name}: 'compile' names {key!r}; the matrix sets it ({AXIS_KEYS[key]})"
            )
        if key not in COMPILE_KEYS:
            raise WorkloadError(
                f"workload {name}: 'compile' has unknown key {key!r}; allowed: "
                + ", ".join(COMPILE_KEYS)
            )
        if not isinstance(given, COMPILE_KEYS[key]):
            raise WorkloadError(
                f"workload {name}: 'compile' {key} must be a {COMPILE_KEYS[key].__name__}, "  # type: ignore[union-attr]
                f"got {type(given).__name__}"
            )
    try:
        json.dumps(value, sort_keys=True)
    except (TypeError, ValueError) as exc:
        raise WorkloadError(
            f"workload {name}: 'compile' must hold plain values (str, number, bool, list, "
            f"dict): {exc}"
        ) from None
    return dict(value)


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
        options = compile_options(made.get("compile"), name)
    elif isinstance(made, (tuple, list)) and len(made) in (2, 3):
        model, inputs = made[0], made[1]
        second = made[2] if len(made) == 3 else None
        options = {}
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
        options,
    )
