"""Reading results documents: `fxcache-results/1` (one runner) and `fxcache-merged/1` (a fleet).

Everything the reports render comes from these documents; this module checks the parts the
renderers rely on and turns both schemas into one shape: groups of shards, one group per
fingerprint (scope key), so results from different environments are never mixed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ci_fxcache.errors import UsageError

RESULTS_SCHEMA = "fxcache-results/2"
MERGED_SCHEMA = "fxcache-merged/2"
# Version-1 documents are still read (they lack `cause`, `notes`, `explain`).
RESULTS_SCHEMAS = ("fxcache-results/1", RESULTS_SCHEMA)
MERGED_SCHEMAS = ("fxcache-merged/1", MERGED_SCHEMA)
SCHEMAS = (*RESULTS_SCHEMAS, *MERGED_SCHEMAS)
VERDICTS = ("safe", "no-gain", "unsafe", "error", "skipped")
# Problems first: the order rows and summaries use.
VERDICT_ORDER = {"unsafe": 0, "error": 1, "no-gain": 2, "safe": 3, "skipped": 4}
_COMBO_FIELDS = ("id", "workload", "device", "dtype", "dynamic", "mechanism", "verdict")


@dataclass
class Shard:
    """One runner's results document (schema `fxcache-results/1`), as loaded."""

    doc: dict[str, Any]
    source: str = ""

    @property
    def combos(self) -> list[dict[str, Any]]:
        return list(self.doc.get("combos") or [])

    @property
    def fingerprint(self) -> dict[str, Any]:
        return dict(self.doc.get("fingerprint") or {})  # null when verify could not read it

    @property
    def runner_name(self) -> str:
        runner = self.doc.get("runner") or {}
        return str(runner.get("name") or "runner")


@dataclass
class Group:
    """Shards that share one fingerprint (scope key): comparable results."""

    key: str
    shards: list[Shard] = field(default_factory=list)

    @property
    def fingerprint(self) -> dict[str, Any]:
        return self.shards[0].fingerprint

    @property
    def scope_key(self) -> str:
        return str(self.shards[0].doc.get("scope_key") or "")


@dataclass
class Results:
    """A loaded document of either schema: `groups` has one entry for a single runner."""

    schema: str
    report_id: str
    groups: list[Group]
    doc: dict[str, Any]

    @property
    def is_fleet(self) -> bool:
        return self.schema in MERGED_SCHEMAS


def group_key(doc: dict[str, Any]) -> str:
    """What keeps environments apart: the scope key without its free-form suffix."""
    from ci_fxcache import scopekey

    key = str(doc.get("scope_key") or "")
    parsed = scopekey.parse(key) if key else None
    if parsed is not None:
        return parsed.scope
    if key:
        return key
    # No scope key: fall back to the canonical JSON of the fingerprint itself.
    return json.dumps(doc.get("fingerprint") or {}, sort_keys=True)


def check_results_doc(doc: Any, where: str) -> dict[str, Any]:
    """Validate a `fxcache-results/1` document's shape; UsageError naming the first problem."""
    if not isinstance(doc, dict):
        raise UsageError(f"{where}: not a results document (a JSON object was expected)")
    schema = doc.get("schema")
    if schema not in RESULTS_SCHEMAS:
        raise UsageError(
            f"{where}: schema {schema!r} is not supported (expected one of "
            f"{', '.join(RESULTS_SCHEMAS)}); "
            "re-run 'fxcache verify --json' with this fxcache version"
        )
    combos = doc.get("combos")
    if not isinstance(combos, list):
        raise UsageError(f"{where}: 'combos' must be a list")
    if "fingerprint" not in doc or not isinstance(doc["fingerprint"], dict | None):
        raise UsageError(f"{where}: 'fingerprint' must be an object or null")
    for i, combo in enumerate(combos):
        if not isinstance(combo, dict):
            raise UsageError(f"{where}: combos[{i}] must be an object")
        missing = [k for k in _COMBO_FIELDS if k not in combo]
        if missing:
            raise UsageError(f"{where}: combos[{i}] lacks {', '.join(missing)}")
        if combo["verdict"] not in VERDICTS:
            raise UsageError(
                f"{where}: combos[{i}] has verdict {combo['verdict']!r}; "
                f"expected one of {', '.join(VERDICTS)}"
            )
    return doc


def from_document(doc: Any, where: str) -> Results:
    """Turn a parsed document of either schema into `Results`."""
    if not isinstance(doc, dict):
        raise UsageError(f"{where}: not a results document (a JSON object was expected)")
    schema = doc.get("schema")
    if schema in RESULTS_SCHEMAS:
        check_results_doc(doc, where)
        shard = Shard(doc, where)
        return Results(
            schema, str(doc.get("report_id") or "fxcache"), [Group(group_key(doc), [shard])], doc
        )
    if schema in MERGED_SCHEMAS:
        groups_doc = doc.get("groups")
        if not isinstance(groups_doc, list) or not groups_doc:
            raise UsageError(f"{where}: 'groups' must be a non-empty list")
        groups: list[Group] = []
        for gi, gdoc in enumerate(groups_doc):
            shards_doc = gdoc.get("shards") if isinstance(gdoc, dict) else None
            if not isinstance(shards_doc, list) or not shards_doc:
                raise UsageError(f"{where}: groups[{gi}].shards must be a non-empty list")
            shards = [
                Shard(check_results_doc(s, f"{where}: groups[{gi}].shards[{si}]"), where)
                for si, s in enumerate(shards_doc)
            ]
            groups.append(Group(str(gdoc.get("key") or group_key(shards[0].doc)), shards))
        return Results(schema, str(doc.get("report_id") or "fxcache"), groups, doc)
    raise UsageError(
        f"{where}: schema {schema!r} is not supported (expected one of {', '.join(SCHEMAS)}); "
        "produce it with 'fxcache verify --json' or 'fxcache merge' of this fxcache version"
    )


def read_json(path: str | Path) -> Any:
    """Parse a JSON file; UsageError with one line when it is missing or not JSON."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UsageError(f"{p}: no such results file; run 'fxcache verify --json {p}'") from None
    except OSError as exc:
        raise UsageError(f"{p}: cannot read: {exc.strerror}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(
            f"{p}: not valid JSON (line {exc.lineno}: {exc.msg}); was the file truncated?"
        ) from None


def load(path: str | Path) -> Results:
    """Read and validate a results document of either schema."""
    return from_document(read_json(path), str(path))
