"""One reference per version of a workload: which one a hot-only run judges a combination by.

A combination's cold phase records its reference (and artifacts, and verdict) in
`<cache dir>/<combo id>/`. When the workload changes (its identity: worker/identity.py) that
reference no longer judges it: the combination compiles cold again, and where the store has
committed the old files (a job never deletes them) the new version goes to
`<combo id>/versions/<created>-<random>/`, beside the old one, so a later run finds it (and a
run of the old model, on another branch, still finds its own). A hot-only run asks the worker
which of the recorded versions, newest first, the workload still matches.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

from ci_fxcache import timestamps
from ci_fxcache.store import references
from ci_fxcache.store.manifest import holds_committed_files

# The layout of recorded references, and which of them a run compares, are the store's
# (store/references.py): its save prunes the versions no run compares any more.
REFERENCE, REFERENCE_TENSORS = references.REFERENCE, references.REFERENCE_TENSORS
VERSIONS, MAX_COMPARED = references.VERSIONS, references.MAX_COMPARED
# Where several ranks keep theirs: one directory a rank (verify/ranks.py `rank_dir`).
FIRST_RANK = references.FIRST_RANK
has_reference = references.has_reference
CHANGED_TEXT = "the model changed since the recorded reference ({why})"
# Where the identity check itself failed (a crash, a hang, a factory that raises): unknown.
UNCHECKED_TEXT = "the model could not be compared with the recorded reference ({why})"
REVERIFIED = "verified cold and hot again"
GRAPH_WHY = "the graph torch traced differs from the recorded one"
# The note of a factory that built different bits twice from the same seeds (worker/identity.py),
# given by the run that recorded its reference; later runs compare it as that note says.
FACTORY_TEXT = (
    "the factory is not deterministic: called twice from the same seeds it built different "
    "weights or inputs, so later runs compare its source, libraries, the shapes and dtypes of "
    "its weights and inputs, and its eager outputs on the recorded ones within the dtype's "
    "tolerance, not their bits; to have them compared bit for bit, draw from torch's, Python's "
    "or numpy's global random generator (fxcache seeds them) or seed the one it draws from"
)


def recorded(base: Path) -> list[Path]:
    """The directories holding a recorded reference of the combination whose directory is
    `base`: `base` itself and its versions, newest first (at most `MAX_COMPARED`)."""
    return references.compared(base)


def identity(directory: Path) -> dict[str, Any] | None:
    """The workload identity the reference in `directory` was recorded for (None: none)."""
    try:
        found = json.loads((directory / REFERENCE).read_text())["cold_result"]["identity"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return found if isinstance(found, dict) else None


def fresh(base: Path) -> Path:
    """Where a new version of the combination whose directory is `base` is recorded: `base`
    itself unless it holds files the store committed, else a new directory under its versions."""
    if not base.exists() or not holds_committed_files(base):
        return base
    stamp = timestamps.utc_now().replace(":", "").replace("-", "")
    return base / VERSIONS / f"{stamp}-{uuid.uuid4().hex[:8]}"


def changed_text(why: str, unchecked: bool = False) -> str:
    """What changed (or why it could not be told), as the report and progress line say it."""
    return (UNCHECKED_TEXT if unchecked else CHANGED_TEXT).format(why=why)


def changed_note_text(why: str, unchecked: bool = False) -> str:
    """The note of a combination whose workload changed and was verified again."""
    return f"{changed_text(why, unchecked)}: {REVERIFIED}"


def _graphs(result: dict[str, Any]) -> dict[str, set[str]]:
    """The traced-graph (`gm`) hashes of a phase's cache lookups, by cache."""
    graphs: dict[str, set[str]] = {}
    for lookup in (result.get("keyinfo") or {}).get("lookups") or []:
        gm = (lookup.get("components") or {}).get("gm") if isinstance(lookup, dict) else None
        if isinstance(gm, list) and gm and isinstance(gm[0], str):
            graphs.setdefault(str(lookup.get("cache")), set()).add(gm[0])
    return graphs


def graph_changed(cold_result: dict[str, Any], hot_result: dict[str, Any]) -> bool:
    """Whether the hot phase's first call traced a graph the recorded cold phase never did: a
    lookup that missed whose `gm` (the traced graph) is not among the cold phase's of the same
    cache. A hit proves its graph the same; a phase without lookups (a loaded artifact) says
    nothing; a graph compiled later, for the second input shape, is a recompile (`unsafe` when
    only the hot phase needs it), never a changed model."""
    cold = _graphs(cold_result)
    lookups = (hot_result.get("keyinfo") or {}).get("lookups") or []
    first = hot_result.get("first_call_lookups")
    if isinstance(first, int) and not isinstance(first, bool) and first >= 0:
        lookups = lookups[:first]
    for lookup in lookups:
        if not isinstance(lookup, dict) or lookup.get("state") == "hit":
            continue
        gm = (lookup.get("components") or {}).get("gm")
        seen = cold.get(str(lookup.get("cache")))
        if isinstance(gm, list) and gm and seen and gm[0] not in seen:
            return True
    return False
