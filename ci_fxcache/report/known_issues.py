"""Known upstream issues (a data file shipped in the package) matched against combinations."""

from __future__ import annotations

import fnmatch
import functools
import re
from dataclasses import dataclass
from importlib import resources
from typing import Any

from ci_fxcache.env.torch_support import release
from ci_fxcache.errors import UsageError

# Appended to the title of an entry whose torch range could not be checked upstream.
UNVERIFIED = " (torch range unverified)"
_COMPARATOR = re.compile(r"^\s*(>=|<=|==|!=|>|<)\s*([0-9]+(?:\.[0-9]+)*)\s*$")


@dataclass(frozen=True)
class KnownIssue:
    """One upstream report: what it is called, where it lives, and which rows it concerns."""

    id: str
    title: str
    url: str
    torch: str
    match: dict[str, tuple[str, ...]]
    verdicts: tuple[str, ...]

    def applies(self, combo: dict[str, Any], torch_version: str) -> bool:
        """True when this issue concerns `combo` run on `torch_version`."""
        return self.concerns_torch(torch_version) and self.matches(combo)

    def concerns_torch(self, torch_version: str) -> bool:
        """True when `torch_version` is inside this issue's range (or it has none)."""
        return not self.torch or version_in_range(torch_version, self.torch)

    def matches(self, combo: dict[str, Any]) -> bool:
        """True when `combo`'s fields and verdict match, whatever the torch version."""
        if self.verdicts and combo.get("verdict") not in self.verdicts:
            return False
        return all(_any_match(_as_text(combo.get(k)), ps) for k, ps in self.match.items())


@functools.lru_cache(maxsize=4096)  # few distinct values, checked once per row otherwise
def _any_match(value: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatchcase(value, p) for p in patterns)


def _as_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return "" if value is None else str(value)


def _cmp(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    width = max(len(a), len(b))
    a, b = a + (0,) * (width - len(a)), b + (0,) * (width - len(b))
    return (a > b) - (a < b)


def version_in_range(version: str, spec: str) -> bool:
    """Whether `version` satisfies every comparator in `spec` (">=2.8,<2.14")."""
    have = release(version)
    if not have:
        return False
    for clause in spec.split(","):
        m = _COMPARATOR.match(clause)
        if m is None:
            raise UsageError(f"known issues: bad torch range {spec!r}")
        op, want = m.group(1), release(m.group(2))
        c = _cmp(have, want)
        ok = {
            ">=": c >= 0,
            "<=": c <= 0,
            ">": c > 0,
            "<": c < 0,
            "==": c == 0,
            "!=": c != 0,
        }[op]
        if not ok:
            return False
    return True


def parse(data: Any) -> list[KnownIssue]:
    """Build the issue list from the parsed data file."""
    entries = data.get("issues") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        raise UsageError("known issues: the data file needs a list under 'issues'")
    out = []
    for entry in entries:
        match = {
            str(k): tuple(str(v) for v in (vs if isinstance(vs, list) else [vs]))
            for k, vs in (entry.get("match") or {}).items()
        }
        out.append(
            KnownIssue(
                id=str(entry["id"]),
                title=" ".join(str(entry["title"]).split())
                + ("" if entry.get("verified", True) else UNVERIFIED),
                url=str(entry["url"]),
                torch=str(entry.get("torch") or ""),
                match=match,
                verdicts=tuple(str(v) for v in entry.get("verdicts") or ()),
            )
        )
    return out


def load_builtin() -> list[KnownIssue]:
    """The issues shipped in `ci_fxcache/report/known_issues.yaml`."""
    import yaml

    text = resources.files("ci_fxcache.report").joinpath("known_issues.yaml").read_text("utf-8")
    return parse(yaml.safe_load(text))
