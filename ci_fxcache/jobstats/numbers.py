"""One rule for a number read from what the job's code or a writer of the store wrote (a
trace, a history row, a figures file): a count or time that cannot be one counts as 0."""

from __future__ import annotations

import math
from typing import Any

LARGEST = 1e30  # in size: far past any count or time (ns since 1970: ~1.8e18); sums stay finite


def number(value: Any) -> int | float:
    """`value` when it is an int or a float (not a bool), finite and under LARGEST in size;
    else 0 (never infinite, NaN, or an int too large for a float)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 0
    if isinstance(value, float) and not math.isfinite(value):
        return 0
    return value if abs(value) < LARGEST else 0
