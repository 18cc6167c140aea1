"""Flatten nested outputs to their tensors (shared by the worker and the runtime guard)."""

from __future__ import annotations

from typing import Any


def flatten(value: Any) -> list[Any]:
    """Every tensor in `value` (tensors, dicts by sorted key, lists and tuples), in order."""
    import torch  # lazily: `import ci_fxcache.guard` must stay cheap

    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [t for k in sorted(value) for t in flatten(value[k])]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in flatten(v)]
    return []
