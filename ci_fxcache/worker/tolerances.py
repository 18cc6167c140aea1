"""Per-dtype tolerances shared by the matrix and the runtime guard (stdlib only)."""

from __future__ import annotations

# torch.testing.assert_close defaults (rtol, atol) per dtype, with atol widened for the
# low-precision dtypes: their atol of 1e-5 is below one bfloat16/float16 ulp of values near 1,
# so any reordering of a reduction (which compilers do) fails it. The widened atol is one ulp
# at 1.0 for the dtype (bfloat16 2**-7, float16 2**-10); rtol stays at torch's default.
TOLERANCES: dict[str, tuple[float, float]] = {
    "float64": (1e-7, 1e-7),
    "float32": (1.3e-6, 1e-5),
    "float16": (1e-3, 2.0**-10),
    "bfloat16": (1.6e-2, 2.0**-7),
    "bfloat16-autocast": (1.6e-2, 2.0**-7),
}


def tolerance(dtype: str) -> dict[str, float]:
    """`{"rtol": .., "atol": ..}` for a matrix dtype name or a torch dtype's short name."""
    name = dtype.replace("torch.", "")
    rtol, atol = TOLERANCES.get(name, TOLERANCES["float32"])
    return {"rtol": rtol, "atol": atol}
