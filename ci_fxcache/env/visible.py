"""Which devices a process sees, applied as each runtime applies its variables: one function
per runtime, each returning the visible devices and, when the list is not taken as written,
one line saying why.

CUDA (`CUDA_VISIBLE_DEVICES`, CUDA's programming guide and torch's `_parse_visible_devices`):
entries are indices in CUDA's order (leading digits count, as with `strtoul`: `1gpu2` is 1),
`GPU-` UUID prefixes that name exactly one GPU, or `MIG-` ids; the list ends at the first entry
that names no device; a device named twice makes CUDA see no device at all; an empty value hides
every device. HIP (`HIP_VISIBLE_DEVICES`, else `CUDA_VISIBLE_DEVICES`): the same rules over the
agents ROCr left visible (`ROCR_VISIBLE_DEVICES`, which rocminfo has already applied), with
indices or the agents' `GPU-` UUIDs.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import TypeVar

Device = TypeVar("Device")
NO_DEVICE_TWICE = "names the same device twice: the runtime then sees no device at all"


def ordinal(entry: str) -> int:
    """The index an entry gives, read like `strtoul` (leading digits); -1 when it gives none."""
    match = re.match(r"[+-]?\d+", entry.strip())
    return int(match.group()) if match else -1


def _unique_prefix(prefix: str, uuids: Sequence[str]) -> int:
    matches = [i for i, uuid in enumerate(uuids) if uuid.startswith(prefix)]
    return matches[0] if len(matches) == 1 and len(prefix) > len("GPU-") else -1


def _apply(
    variable: str,
    value: str,
    resolve: Callable[[str], tuple[object, Device] | None],
) -> tuple[list[Device], str | None]:
    """Walk the entries of `value`: `resolve` gives (identity, device) or None for an entry
    that names no device."""
    if not value.strip():
        return [], None
    seen: list[object] = []
    picked: list[Device] = []
    for raw in value.split(","):
        entry = raw.strip()
        found = resolve(entry)
        if found is None:
            return picked, (
                f"{variable}: {entry!r} names no device the runtime sees; it ignores it and "
                "every entry after it"
            )
        identity, device = found
        if identity in seen:
            return [], f"{variable}: {value!r} {NO_DEVICE_TWICE}"
        seen.append(identity)
        picked.append(device)
    return picked, None


def cuda_visible(
    value: str | None,
    devices: Sequence[Device],
    uuids: Sequence[str],
    mig_slice: Callable[[str], tuple[int, Device] | None] = lambda _: None,
) -> tuple[list[Device], str | None]:
    """The devices `CUDA_VISIBLE_DEVICES=value` leaves, in its order.

    `devices` are in CUDA's own order (the order indices refer to) with their `uuids`;
    `mig_slice` maps a `MIG-` id to (its parent's position, the slice as a device)."""
    if value is None:
        return list(devices), None

    def resolve(entry: str) -> tuple[object, Device] | None:
        if entry.startswith("MIG-"):
            mig = mig_slice(entry)
            return None if mig is None else (("mig", entry), mig[1])
        index = _unique_prefix(entry, uuids) if entry.startswith("GPU-") else ordinal(entry)
        if not 0 <= index < len(devices):
            return None
        return ("gpu", index), devices[index]

    return _apply("CUDA_VISIBLE_DEVICES", value, resolve)


def hip_visible(
    variable: str, value: str | None, agents: Sequence[Device], uuids: Sequence[str]
) -> tuple[list[Device], str | None]:
    """The agents `variable=value` (HIP_VISIBLE_DEVICES or CUDA_VISIBLE_DEVICES) leaves of
    those ROCr left visible (`agents`, with their `GPU-` `uuids`), in its order."""
    if value is None:
        return list(agents), None

    def resolve(entry: str) -> tuple[object, Device] | None:
        index = _unique_prefix(entry, uuids) if entry.startswith("GPU-") else ordinal(entry)
        return None if not 0 <= index < len(agents) else (index, agents[index])

    return _apply(variable, value, resolve)
