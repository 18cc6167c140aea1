"""The verdict and cause vocabulary of results documents (schema v2), in one place.

Every combination has one verdict and exactly one cause; the report switches on the cause.
docs/verify.md explains each entry.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ci_fxcache.verify import verdict_kinds

VERDICTS = verdict_kinds.names()

# The causes each verdict can have, in the order docs/verify.md lists them.
CAUSES: dict[str, tuple[str, ...]] = {v.name: v.causes for v in verdict_kinds.ALL}
VERDICT_OF_CAUSE = {cause: verdict for verdict, causes in CAUSES.items() for cause in causes}

# Findings that never change a verdict (`notes[].kind`).
NOTE_KINDS = (
    "model-recompiles",
    "uncacheable",
    "nondeterministic",
    "eager-unreproducible",
    "factory-nondeterministic",
    "random-ops",
    "fp64-accuracy",
    "carried",
    "workload-changed",
    "triton-uncounted",
    "triton-driver-built",
)

# Which verdicts fail `--fail-on X` (each level includes the ones before it).
FAIL_ON: dict[str, tuple[str, ...]] = verdict_kinds.fail_on()


def note(kind: str, text: str, **extra: object) -> dict[str, object]:
    """One `notes` entry."""
    if kind not in NOTE_KINDS:
        raise ValueError(f"unknown note kind {kind!r}")
    return {"kind": kind, "text": text, **extra}


def summary(combos: Iterable[dict[str, Any]]) -> dict[str, int]:
    """Count of each verdict."""
    counts = dict.fromkeys(VERDICTS, 0)
    for combo in combos:
        counts[combo["verdict"]] += 1
    return counts


def failing(combos: Iterable[dict[str, Any]], fail_on: str) -> list[dict[str, Any]]:
    """The combos whose verdict fails `--fail-on fail_on`."""
    return [c for c in combos if c["verdict"] in FAIL_ON[fail_on]]
