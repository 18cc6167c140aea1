"""Visible devices as the runtimes apply their variables: one table per runtime.

The rules are CUDA's (its programming guide's CUDA_VISIBLE_DEVICES section) as torch's
`_parse_visible_devices` (torch/cuda/__init__.py, 2.13 and 2.14) models them: leading digits
count (`strtoul`), the list ends at the first entry that names no device, a device named twice
leaves no device at all, an empty value hides every device, `GPU-` prefixes must name exactly one
GPU. HIP applies the same rules to what ROCr left visible, with indices or `GPU-` UUIDs.
"""

from __future__ import annotations

import pytest

from ci_fxcache.env import visible

# Four GPUs in the order indices refer to, with their UUIDs.
DEVICES = ["A100", "H100", "V100", "P100"]
UUIDS = ["GPU-5d5ba0d6-d33d", "GPU-0e5e1f3a-8b9c", "GPU-9a8b7c6d-5e4f", "GPU-0e11aaaa-0000"]


def mig(entry: str) -> tuple[int, str] | None:
    return (0, "A100 MIG 3g.40gb") if entry == "MIG-c6d4f1ef" else None


@pytest.mark.parametrize(
    ("value", "seen", "problem"),
    [
        (None, DEVICES, None),  # unset: every device
        ("", [], None),  # empty: none, and nothing to warn about
        ("2,1", ["V100", "H100"], None),  # the order given
        (" 1 , 0 ", ["H100", "A100"], None),  # spaces around entries are ignored
        ("1gpu2,2ampere", ["H100", "V100"], None),  # strtoul: leading digits count
        ("0,2,-1,1", ["A100", "V100"], "'-1' names no device"),  # CUDA's own example
        ("1,7,0", ["H100"], "'7' names no device"),  # out of range ends the list
        ("0,,1", ["A100"], "'' names no device"),  # an empty entry ends it too
        ("abc,0", [], "'abc' names no device"),
        ("0,0", [], "twice"),  # a repeated entry: CUDA sees no device
        ("1,GPU-0e5e1f3a", [], "twice"),  # the same GPU by index and by UUID
        ("GPU-9a8b,GPU-5d5b", ["V100", "A100"], None),  # UUID prefixes
        ("GPU-0e", [], "'GPU-0e' names no device"),  # ambiguous prefix (two GPUs)
        ("GPU-", [], "'GPU-' names no device"),  # the bare prefix names nothing
        ("GPU-0e5e,3", ["H100", "P100"], None),  # UUIDs and indices mixed
        ("MIG-c6d4f1ef", ["A100 MIG 3g.40gb"], None),
        ("MIG-c6d4f1ef,MIG-c6d4f1ef", [], "twice"),
        ("MIG-00000000,1", [], "'MIG-00000000' names no device"),
    ],
)
def test_cuda_visible_devices(value: str | None, seen: list[str], problem: str | None) -> None:
    got, message = visible.cuda_visible(value, DEVICES, UUIDS, mig)
    assert got == seen
    if problem is None:
        assert message is None
    else:
        assert message is not None and problem in message and "CUDA_VISIBLE_DEVICES" in message


AGENTS = ["gfx90a#0", "gfx90a#1", "gfx942"]
AGENT_UUIDS = ["GPU-3c1e6a8a12b5c3d4", "GPU-8f2d6c1b7a9e0d43", "GPU-b3a1c2d4e5f60718"]


@pytest.mark.parametrize(
    ("variable", "value", "seen", "problem"),
    [
        ("HIP_VISIBLE_DEVICES", None, AGENTS, None),
        ("HIP_VISIBLE_DEVICES", "2,0", ["gfx942", "gfx90a#0"], None),
        ("HIP_VISIBLE_DEVICES", "GPU-b3a1", ["gfx942"], None),  # UUIDs, as HIP accepts them
        ("HIP_VISIBLE_DEVICES", "GPU-8f2d,0", ["gfx90a#1", "gfx90a#0"], None),
        ("HIP_VISIBLE_DEVICES", "1,1", [], "twice"),
        ("HIP_VISIBLE_DEVICES", "GPU-b3a1,2", [], "twice"),
        ("HIP_VISIBLE_DEVICES", "1,5", ["gfx90a#1"], "'5' names no device"),
        ("HIP_VISIBLE_DEVICES", "GPU-ffff", [], "'GPU-ffff' names no device"),
        ("CUDA_VISIBLE_DEVICES", "2", ["gfx942"], None),
        ("HIP_VISIBLE_DEVICES", "", [], None),
    ],
)
def test_hip_visible_devices(
    variable: str, value: str | None, seen: list[str], problem: str | None
) -> None:
    got, message = visible.hip_visible(variable, value, AGENTS, AGENT_UUIDS)
    assert got == seen
    if problem is None:
        assert message is None
    else:
        assert message is not None and problem in message and variable in message


@pytest.mark.parametrize(
    ("entry", "index"),
    [("0", 0), ("12", 12), ("+3", 3), ("-1", -1), ("1gpu2", 1), ("gpu1", -1), ("", -1)],
)
def test_ordinal_reads_like_strtoul(entry: str, index: int) -> None:
    assert visible.ordinal(entry) == index
