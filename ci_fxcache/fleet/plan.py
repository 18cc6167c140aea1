"""The fleet plan: runner pools -> the job matrix of the reusable fxcache-verify workflow.

A pool is the set of runner labels one verify job runs on (`runs-on:` takes a list and picks a
runner that has all of them). The plan gives each pool a stable name and the name of the
artifact its results travel in, so the merge job can tell which pools reported.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from ci_fxcache import names
from ci_fxcache.errors import UsageError

# GitHub's limit on the jobs one matrix may generate.
MAX_JOBS = 256
_LABEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


@dataclass(frozen=True)
class Pool:
    """One verify job: the labels it runs on and the artifact it uploads."""

    labels: tuple[str, ...]
    artifact: str

    @property
    def name(self) -> str:
        return "+".join(self.labels)

    def to_dict(self) -> dict[str, Any]:
        return {"pool": self.name, "runs-on": list(self.labels), "artifact": self.artifact}


def _split_text(spec: str) -> list[list[str]]:
    pools = []
    for entry in re.split(r"[,\n]", spec):
        entry = entry.strip()
        if entry:
            pools.append([label.strip() for label in entry.split("+")])
    return pools


def _split_json(spec: str) -> list[list[str]]:
    try:
        doc = json.loads(spec)
    except json.JSONDecodeError as exc:
        raise UsageError(f"runners: not valid JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(doc, list):
        raise UsageError("runners: a JSON value must be a list of labels or label lists")
    pools = []
    for item in doc:
        if isinstance(item, str):
            pools.append([item.strip()])
        elif isinstance(item, list) and all(isinstance(x, str) for x in item):
            pools.append([x.strip() for x in item])
        else:
            raise UsageError(f"runners: {json.dumps(item)} is neither a label nor a label list")
    return pools


def parse_runners(spec: str) -> list[list[str]]:
    """Split a runners spec (comma/newline list with `+`, or JSON) into label lists."""
    text = spec.strip()
    return _split_json(text) if text.startswith(("[", "{")) else _split_text(text)


def plan(spec: str, report_id: str = "fxcache") -> list[Pool]:
    """Validate the runner pools and name their jobs and artifacts."""
    names.check_report_id(report_id)
    pools: list[Pool] = []
    seen: set[frozenset[str]] = set()
    for labels in parse_runners(spec):
        for label in labels:
            if not _LABEL.match(label):
                raise UsageError(
                    f"runners: {label!r} is not a runner label (letters, digits, '.', '_', '-'; "
                    "join the labels of one pool with '+')"
                )
        ordered = tuple(dict.fromkeys(labels))
        key = frozenset(ordered)
        if key in seen:
            raise UsageError(f"runners: pool {'+'.join(ordered)!r} is listed twice")
        seen.add(key)
        pools.append(Pool(ordered, f"fxcache-{report_id}-pool-{'+'.join(ordered)}"))
    if not pools:
        raise UsageError("runners: no runner pool given (e.g. 'gpu-a100, gpu-h100, gpu-l4')")
    if len(pools) > MAX_JOBS:
        raise UsageError(f"runners: {len(pools)} pools, but a job matrix holds at most {MAX_JOBS}")
    return pools


def matrix(pools: list[Pool]) -> dict[str, Any]:
    """The `strategy.matrix` object (for `fromJSON`)."""
    return {"include": [p.to_dict() for p in pools]}


def combos(flags: dict[str, str | None], matrix_file: str | None) -> list[str]:
    """Check the verification matrix exactly as `fxcache verify` reads it; its combination ids."""
    from ci_fxcache.verify import matrix as verify_matrix

    return [c.id for c in verify_matrix.build(flags, matrix_file).combos()]
