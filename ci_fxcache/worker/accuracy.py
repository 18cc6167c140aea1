"""Comparing results: bitwise and dtype tolerance, and accuracy against a float64 reference.

`compare` is the hot-vs-cold check (bitwise, or within the dtype tolerance). `fp64_judgement`
is the compiled-vs-eager check for a compiled result that is not within the dtype tolerance of
eager: like PyTorch's own accuracy checks, it asks whether the compiled result is about as
close to a float64 run as eager is. In low precision eager is itself off the true value, and a
compiler that reorders a reduction can land on the other side of it; only a compiled result
clearly further from the truth than eager is wrong. One closer than eager never is.
"""

from __future__ import annotations

import math
from typing import Any

import torch

# How much further from the float64 result than eager (RMSE) a compiled result may be. Low
# precision (and small tensors, where a few elements dominate the RMSE) get 3x, as in PyTorch's
# benchmark accuracy check; everything else 2x.
LOW_PRECISION_MULTIPLIER = 3.0
MULTIPLIER = 2.0
SMALL_TENSOR = 1000


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().cpu().reshape(-1).contiguous().view(torch.uint8)


def bitwise_equal(got: list[torch.Tensor], want: list[torch.Tensor]) -> bool:
    """Same count, shapes, dtypes and bits."""
    return len(got) == len(want) and all(
        a.shape == b.shape and a.dtype == b.dtype and torch.equal(_bits(a), _bits(b))
        for a, b in zip(got, want, strict=True)
    )


def _mismatch(detail: str) -> dict[str, Any]:
    return {"max_abs_err": None, "bitwise": False, "close": False, "detail": detail}


def compare(
    got: list[torch.Tensor], want: list[torch.Tensor], tol: dict[str, float]
) -> dict[str, Any]:
    """Max absolute error, bitwise equality and closeness (dtype tolerance) of two results."""
    if len(got) != len(want):
        return _mismatch(f"{len(got)} tensors vs {len(want)}")
    err, close, detail = 0.0, True, ""
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        if a.shape != b.shape or a.dtype != b.dtype:
            return _mismatch(f"tensor {i}: {a.dtype}{list(a.shape)} vs {b.dtype}{list(b.shape)}")
        a64, b64 = a.detach().cpu().double(), b.detach().cpu().double()
        if a.numel():
            diff = (a64 - b64).abs().nan_to_num(nan=float("inf"))
            both_nan = a64.isnan() & b64.isnan()
            err = max(err, float(diff.masked_fill(both_nan, 0.0).max()))
        if not torch.allclose(a64, b64, rtol=tol["rtol"], atol=tol["atol"], equal_nan=True):
            if close:
                detail = f"tensor {i} differs beyond rtol={tol['rtol']} atol={tol['atol']}"
            close = False
    if err == float("inf"):  # NaN or inf where the other side is finite: not valid JSON
        return _mismatch(detail or "non-finite values differ")
    return {
        "max_abs_err": err,
        "bitwise": bitwise_equal(got, want),
        "close": close,
        "detail": detail,
    }


# torch._dynamo.utils.same's default `tol` (torch 2.13): PyTorch's own accuracy checks accept
# a result within allclose(atol=tol, rtol=tol) of eager, or within `tol / 10` RMSE (plus the
# multiplier) of eager's distance to the float64 run.
SAME_TOL = 1e-4


def _rmse(truth: torch.Tensor, value: torch.Tensor) -> float:
    return float(torch.sqrt(torch.mean(torch.square(truth - value))))


def multiplier(low_precision: bool, numel: int) -> float:
    """How many times eager's RMSE against float64 the compiled RMSE may be."""
    return LOW_PRECISION_MULTIPLIER if low_precision or numel < SMALL_TENSOR else MULTIPLIER


def fp64_judgement(
    compiled: list[torch.Tensor],
    eager: list[torch.Tensor],
    fp64: list[torch.Tensor],
    tol: dict[str, float],
    low_precision: bool,
) -> tuple[bool, str]:
    """Whether `compiled` is about as accurate as `eager`, both measured against `fp64`.

    Per tensor: within the tolerance of eager passes; otherwise the compiled RMSE against
    float64 may be at most `multiplier` times eager's plus a tenth of the tolerance. The
    tolerance is the dtype's, but never below `same()`'s default (`SAME_TOL`): a gradient that
    is zero in exact arithmetic (a conv bias before BatchNorm) is rounding noise in both runs,
    and the dtype's own float32 atol would judge one noise against the other.
    Returns (passes, what was measured)."""
    tol = {name: max(value, SAME_TOL) for name, value in tol.items()}
    if not len(compiled) == len(eager) == len(fp64):
        return False, f"{len(compiled)} compiled tensors, {len(eager)} eager, {len(fp64)} fp64"
    worst = ""
    for i, (c, e, r) in enumerate(zip(compiled, eager, fp64, strict=True)):
        c64, e64, r64 = (t.detach().cpu().double() for t in (c, e, r))
        if c64.shape != r64.shape:
            return False, f"tensor {i}: fp64 shape {list(r64.shape)} vs {list(c64.shape)}"
        if torch.allclose(c64, e64, rtol=tol["rtol"], atol=tol["atol"], equal_nan=True):
            continue
        compiled_err, eager_err = _rmse(r64, c64), _rmse(r64, e64)
        if math.isnan(eager_err) and not math.isnan(compiled_err):
            continue  # eager overflowed where the compiled result did not: better, not wrong
        bound = multiplier(low_precision, r64.numel()) * eager_err + tol["atol"] / 10
        measured = (
            f"tensor {i}: RMSE vs fp64 compiled {compiled_err:.3g}, eager {eager_err:.3g}, "
            f"bound {bound:.3g}"
        )
        if not compiled_err <= bound:
            return False, measured
        worst = worst or measured
    return True, worst
