"""Runtime guard for training scripts: check a compiled function against its reference.

Import it in the job that uses torch.compile (it imports torch lazily, on first use):

    from ci_fxcache.guard import guarded_compile
    step = guarded_compile(model, example_x)          # torch.compile + one checked call

On a mismatch beyond the dtype's tolerance (the same table `fxcache verify` uses), or when the
compiled function fails to load or run (a corrupted cached `.so`: `BackendCompilerFailed`),
the guard logs why, sets `torch._inductor.config.force_disable_caches = True` for the rest of the
process, resets Dynamo and compiles again, so a bad cache entry can never reach a result.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from ci_fxcache.worker.tensors import flatten
from ci_fxcache.worker.tolerances import tolerance

log = logging.getLogger("ci_fxcache.guard")


class GuardError(RuntimeError):
    """The compiled function still disagrees with its reference with caches disabled."""


@dataclass
class Check:
    """Outcome of one comparison."""

    ok: bool
    max_abs_err: float | None
    detail: str

    def __bool__(self) -> bool:
        return self.ok


def compare(got: Any, want: Any, rtol: float | None = None, atol: float | None = None) -> Check:
    """Compare every tensor in two (nested) results with per-dtype tolerances."""
    import torch

    a_list, b_list = flatten(got), flatten(want)
    if len(a_list) != len(b_list):
        return Check(False, None, f"{len(a_list)} output tensors vs {len(b_list)} in the reference")
    worst = 0.0
    for i, (a, b) in enumerate(zip(a_list, b_list, strict=True)):
        if a.shape != b.shape:
            return Check(False, None, f"output {i}: shape {list(a.shape)} vs {list(b.shape)}")
        tol = tolerance(str(a.dtype))
        r = tol["rtol"] if rtol is None else rtol
        t = tol["atol"] if atol is None else atol
        a64, b64 = a.detach().cpu().double(), b.detach().cpu().double()
        if a.numel():
            worst = max(worst, float((a64 - b64).abs().nan_to_num(nan=float("inf")).max()))
        if not torch.allclose(a64, b64, rtol=r, atol=t, equal_nan=True):
            return Check(
                False,
                worst,
                f"output {i} ({a.dtype}) differs: max abs err {worst:g} "
                f"beyond rtol={r:g} atol={t:g}",
            )
    return Check(True, worst, "")


def verify_compiled(
    compiled_fn: Any,
    reference_fn: Any,
    *inputs: Any,
    rtol: float | None = None,
    atol: float | None = None,
) -> Check:
    """Run both on `inputs` (under no_grad) and compare with the dtype-aware tolerances."""
    import torch

    with torch.no_grad():
        want = reference_fn(*inputs)
        got = compiled_fn(*inputs)
        check = compare(got, want, rtol, atol)
        if check:
            return check
        # Confirm against a fresh eager run: an eager result that changes between runs (seen
        # once on a loaded CPU) must not be mistaken for a bad cache entry.
        again = reference_fn(*inputs)
    if compare(again, want, 0.0, 0.0):
        return check
    log.warning("fxcache guard: the eager reference changed between two runs; using the second")
    return compare(got, again, rtol, atol)


def disable_caches(reason: str) -> None:
    """Turn Inductor's caches off for this process and forget compiled code, logging why."""
    import torch
    import torch._inductor.config as inductor_config

    log.warning("fxcache guard: %s; disabling Inductor caches and recompiling", reason)
    inductor_config.force_disable_caches = True
    torch._dynamo.reset()


def guarded_compile(
    fn: Any, *example_inputs: Any, reference_fn: Any = None, **compile_kwargs: Any
) -> Any:
    """`torch.compile(fn)`, checked once on `example_inputs` against `reference_fn` (default:
    `fn` itself, eager). On a mismatch, or an error from the compiled call (a cached entry that
    fails to load): disable caches, recompile, check again; GuardError when it still disagrees
    (then the compiler itself, not the cache, is wrong); an error then propagates."""
    import torch

    reference = fn if reference_fn is None else reference_fn
    compiled = torch.compile(fn, **compile_kwargs)
    try:
        check = verify_compiled(compiled, reference, *example_inputs)
    except Exception as exc:  # e.g. BackendCompilerFailed: a cached .so that does not load
        first_line = (str(exc).strip().splitlines() or [""])[0][:300]
        disable_caches(
            f"compiled function failed to load or run ({type(exc).__name__}: {first_line})"
        )
    else:
        if check:
            return compiled
        disable_caches(f"compiled output disagrees with the reference ({check.detail})")
    compiled = torch.compile(fn, **compile_kwargs)
    again = verify_compiled(compiled, reference, *example_inputs)
    if not again:
        raise GuardError(
            f"compiled output still disagrees with caches disabled ({again.detail}): "
            "a compiler problem, not a cache problem"
        )
    log.warning("fxcache guard: recompiled without caches; output now matches the reference")
    return compiled
