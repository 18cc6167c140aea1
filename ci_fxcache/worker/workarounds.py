"""Checks of the workarounds for known upstream failures of torch's artifact APIs, run in the
phase that met the failure, so that a report recommends a workaround only where it was shown
to work on this runner (docs/verify.md, "Known upstream failures of the artifact APIs").

- `specialize-float`: `aot_compile` raised TensorifyScalarRestartAnalysis; the cold phase
  compiles again with `torch._dynamo.config.specialize_float = True` (`artifacts.aot`) and the
  combination is then judged cold and hot as usual: the verdict is the check.
- `unmarked-inputs` (here): the loaded `aot` artifact's guard refused inputs marked with
  `mark_dynamic`; after the phase, the same loaded artifact is called with the second input
  shape, unmarked, and compared with eager within the dtype tolerance.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from . import artifacts

if TYPE_CHECKING:
    from .phase import PhaseRun

VsEager = Callable[..., dict[str, Any]]


def unmarked_inputs(
    run: PhaseRun, compiled: Any, result: dict[str, Any], vs_eager: VsEager, seed: int
) -> None:
    """When the hot phase's loaded artifact refused marked inputs: the loaded artifact on the
    second input shape without marks, against eager (`vs_eager`: the phase's own judgement of
    compiled vs eager, with its eager and float64 rechecks), recorded as
    `artifact.workaround` (`close`, `max_abs_err`, `detail`, or the `error` it raised)."""
    loaded = artifacts.refused_marking(compiled)
    if loaded is None or run.second is None:
        return
    check: dict[str, Any] = {"name": "unmarked-inputs", "inputs": "second input shape, unmarked"}
    # Fresh tensors: the phase's own calls left their marks on the inputs they marked.
    inputs = tuple(t.detach().clone() if isinstance(t, torch.Tensor) else t for t in run.second)
    marked, run.marked = run.marked, []
    try:
        outs = run.call(loaded, inputs, seed)
        eager = run.call(run.work.model, inputs, seed)
        verdict = vs_eager(run, outs, eager, inputs, seed, {})
        check.update(
            close=bool(verdict["close"]),
            max_abs_err=verdict["max_abs_err"],
            detail=str(verdict.get("detail") or "")[:300],
        )
    except Exception as exc:
        check["error"] = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
    finally:
        run.marked = marked
    result["artifact"]["workaround"] = check
