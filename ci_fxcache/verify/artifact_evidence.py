"""What a hot phase of an artifact mechanism (a record with `hits="artifact"`: aot,
precompile-api) shows, in the terms the verdict checks use: the artifact loaded (a hit), torch
refused it (the phase fell back to a compile), or it loaded and the process still compiled
graphs (a miss). Kernel builds, outputs and time are judged as for every mechanism
(`verdicts.CHECKS`)."""

from __future__ import annotations

from typing import Any

from ci_fxcache import mechanisms


def judges(mechanism: str) -> bool:
    """Whether `mechanism`'s hits are its artifact's load (its record's `hits`)."""
    record = mechanisms.find(mechanism)
    return record is not None and record.hits == "artifact"


def _size(count: Any) -> str:
    return f"{int(count) / 1000:.1f} kB" if isinstance(count, int) else "size unknown"


def compiled_graphs(hot: dict[str, Any]) -> int:
    """Graphs the hot process compiled although the artifact loaded (Dynamo traces or
    AOTAutograd compiles, whichever counted more: one graph goes through both)."""
    artifact = hot.get("artifact") or {}
    if not artifact.get("loaded"):
        return 0
    return max(int(artifact.get("traced_graphs") or 0), int(artifact.get("compiled_graphs") or 0))


def hits_and_misses(hot: dict[str, Any]) -> tuple[int, int, str]:
    """Hits (the artifact loaded), misses (refused, or graphs compiled after the load) and a
    short description, as `verdicts.hits_and_misses` gives them for the caches."""
    artifact = hot.get("artifact") or {}
    name = artifact.get("file") or "the artifact"
    if artifact.get("refused"):
        return 0, 1, f"{name} refused"
    if not artifact.get("loaded"):
        return 0, 1, f"{name} not loaded"
    shown = f"{name} loaded, {_size(artifact.get('bytes'))}"
    again = compiled_graphs(hot)
    if again:
        shown += f"; the hot process compiled {again} graph{'s' if again != 1 else ''} again"
    return 1, again, shown


def refusal(hot: dict[str, Any]) -> str | None:
    """Why torch refused the artifact (its error or warning), or None when it did not."""
    refused = (hot.get("artifact") or {}).get("refused")
    return str(refused) if refused else None
