"""A user workload (`tests.workloads.older_torch:sin_matmul`) that makes the real torch it runs
on look like an older release: `FXCACHE_TEST_DROP=set_stance,caching_precompile` removes those
options before the phase uses them, so the worker's presence checks are exercised for real.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch._dynamo.config

from tests.workloads.faulty import sin_matmul as _sin_matmul

_DROPS = {
    "set_stance": (torch.compiler, "set_stance"),
    "caching_precompile": (torch._dynamo.config, "caching_precompile"),
}


def sin_matmul(dtype: torch.dtype, device: str) -> dict[str, Any]:
    """`x.sin() @ y`, after removing the options named in FXCACHE_TEST_DROP."""
    for name in filter(None, os.environ.get("FXCACHE_TEST_DROP", "").split(",")):
        owner, attribute = _DROPS[name]
        if hasattr(owner, attribute):
            delattr(owner, attribute)
    return _sin_matmul(dtype, device)
