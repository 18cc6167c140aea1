"""What torch's own cache keys are made of, recorded in every phase.

Inductor's FX graph cache and the AOTAutograd cache emit one structured-trace artifact per
lookup (`fx_graph_cache_hit|miss|bypass`, `aotautograd_cache_hit|miss|bypass`): the records
that `TORCH_TRACE` writes and tlparse reads. Their JSON payload carries the key and its
`components`, one line per attribute hashed into the key (`[hash] name: value`). A handler on
torch's trace logger receives the same records in this process. The Dynamo cache
(caching precompile) checks `SystemInfo` instead; it is recorded beside the lookups.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import platform
from typing import Any

from .keylines import bypass_reason as _bypass_reason
from .keylines import lookup_kind, parse_components

# AOTAutograd computes its components only when this logger is enabled for DEBUG.
_AOT_LOGGER = "torch._functorch._aot_autograd.autograd_cache"


class _Recorder(logging.Handler):
    """Keeps every cache lookup that torch reports through its structured trace."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lookups: list[dict[str, Any]] = []

    def emit(self, record: logging.LogRecord) -> None:
        metadata = getattr(record, "metadata", None)
        artifact = metadata.get("artifact") if isinstance(metadata, dict) else None
        kind = lookup_kind(str((artifact or {}).get("name", "")))
        if kind is None:
            return
        try:
            info = json.loads(getattr(record, "payload", None) or "{}")
        except (TypeError, ValueError):
            info = {}
        lookup: dict[str, Any] = {
            "cache": kind[0],
            "state": kind[1],
            "key": info.get("key"),
            "components": parse_components(list(info.get("components") or [])),
        }
        reason = _bypass_reason(info) if isinstance(info, dict) else None
        if reason:
            lookup["bypass_reason"] = reason
        self.lookups.append(lookup)


class _BelowLevel(logging.Filter):
    """Drops the records that only our DEBUG level lets through (torch's own level stays)."""

    def __init__(self, level: int) -> None:
        super().__init__()
        self.level = level

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= self.level


_RECORDER: list[_Recorder] = []


def install() -> None:
    """Start recording this process's cache lookups (idempotent)."""
    if _RECORDER:
        _RECORDER[0].lookups.clear()
        return
    from torch._logging._internal import trace_log

    recorder = _Recorder()
    trace_log.addHandler(recorder)
    aot = logging.getLogger(_AOT_LOGGER)
    aot.addFilter(_BelowLevel(aot.getEffectiveLevel()))
    aot.setLevel(logging.DEBUG)
    _RECORDER.append(recorder)


def _system(device: str) -> dict[str, Any]:
    """What the Dynamo cache checks (python, torch; on a GPU also toolkit, Triton, GPU name)
    and the key tag. A CPU combination does not touch the GPU for it."""
    import torch
    import torch.compiler.config as compiler_config

    system: dict[str, Any] = {
        "python_version": platform.python_version(),
        "torch_version": torch.__version__,
    }
    if device != "cpu":
        try:
            from torch._dynamo.package import SystemInfo

            system.update(dataclasses.asdict(SystemInfo.current()))
        except Exception:  # older torch, no package support: the FX lookups still say enough
            pass
    if isinstance(system.get("triton_version"), tuple):
        system["triton_version"] = ".".join(map(str, system["triton_version"]))
    system["cache_key_tag"] = compiler_config.cache_key_tag
    return system


def collect(device: str) -> dict[str, Any]:
    """The lookups seen since `install()` and the system facts torch's caches check."""
    lookups = list(_RECORDER[0].lookups) if _RECORDER else []
    return {"lookups": lookups, "system": _system(device)}
