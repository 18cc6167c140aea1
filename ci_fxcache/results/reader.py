"""Reading results documents: `fxcache-results/2` (one runner) and `fxcache-merged/2` (a fleet).

Everything the reports render comes from these documents; this module checks the parts the
renderers rely on and turns both schemas into one shape: groups of shards, one group per
fingerprint (scope key), so results from different environments are never mixed. Version-1
documents are still read: each combo gets the `cause` and `notes` that version 2 records
(`upgrade_combo`, mapping in docs/verify.md), so readers only ever see version 2.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ci_fxcache import userfiles
from ci_fxcache.errors import UsageError
from ci_fxcache.results import schema_check
from ci_fxcache.verify import causes, verdict_kinds
from ci_fxcache.verify.causes import CAUSES, VERDICT_OF_CAUSE, VERDICTS

RESULTS_SCHEMA = "fxcache-results/2"
MERGED_SCHEMA = "fxcache-merged/2"
RESULTS_SCHEMA_V1 = "fxcache-results/1"
MERGED_SCHEMA_V1 = "fxcache-merged/1"
RESULTS_SCHEMAS = (RESULTS_SCHEMA_V1, RESULTS_SCHEMA)
MERGED_SCHEMAS = (MERGED_SCHEMA_V1, MERGED_SCHEMA)
SCHEMAS = (*RESULTS_SCHEMAS, *MERGED_SCHEMAS)
# Problems first: the order rows and summaries use.
VERDICT_ORDER = verdict_kinds.order()
_COMBO_FIELDS = ("id", "workload", "device", "dtype", "dynamic", "mechanism", "verdict")


@dataclass
class Shard:
    """One runner's results document (schema `fxcache-results/2`), as loaded."""

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
        return self.schema == MERGED_SCHEMA


def group_key(doc: dict[str, Any]) -> str:
    """What keeps environments apart: the scope key without its free-form suffix."""
    from ci_fxcache.env import scopekey

    key = str(doc.get("scope_key") or "")
    parsed = scopekey.parse(key) if key else None
    if parsed is not None:
        return parsed.scope
    if key:
        return key
    # No scope key: fall back to the canonical JSON of the fingerprint itself.
    return json.dumps(doc.get("fingerprint") or {}, sort_keys=True)


def check_results_doc(doc: Any, where: str) -> dict[str, Any]:
    """Validate a results document's shape (version 2, or 1 upgraded to 2); UsageError naming
    the first problem. Returns the version-2 document."""
    if not isinstance(doc, dict):
        raise UsageError(f"{where}: not a results document (a JSON object was expected)")
    schema = doc.get("schema")
    if schema not in (RESULTS_SCHEMA, RESULTS_SCHEMA_V1):
        raise UsageError(
            f"{where}: schema {schema!r} is not supported (expected {RESULTS_SCHEMA!r}); "
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
        if not _is_number_or_null(combo.get("speedup")):
            raise UsageError(
                f"{where}: combos[{i}] has speedup {combo['speedup']!r}; "
                "expected a finite number or null"
            )
    broken = schema_check.problem(doc)
    if broken:
        raise UsageError(
            f"{where}: not a valid results document: {broken} (results.schema.json); "
            "re-run 'fxcache verify --json' to produce one"
        )
    if schema == RESULTS_SCHEMA_V1:
        upgraded = [upgrade_combo(c) for c in combos]
        return {
            **doc,
            "schema": RESULTS_SCHEMA,
            "combos": upgraded,
            "summary": causes.summary(upgraded),
        }
    for i, combo in enumerate(combos):
        cause = combo.get("cause")
        if cause not in CAUSES[combo["verdict"]]:
            raise UsageError(
                f"{where}: combos[{i}] has cause {cause!r} with verdict {combo['verdict']!r}; "
                f"expected one of {', '.join(CAUSES[combo['verdict']])}"
            )
    return doc


def _is_number_or_null(value: object) -> bool:
    if value is None:
        return True
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def upgrade_combo(combo: dict[str, Any]) -> dict[str, Any]:
    """A version-1 combo with the `cause` and `notes` of version 2.

    Version 1 recorded no cause; it is derived from the verdict, the phase status, the
    counters and the errors (docs/verify.md, "Reading version-1 documents"). The verdict is
    the one version 1 recorded, except that a cold compile differing from eager becomes
    `error` / `compiler-mismatch` as version 2 judges it."""
    notes: list[dict[str, Any]] = []
    cold = combo.get("cold") or {}
    if cold.get("eager_reproducible") is False:
        text = "; ".join(cold.get("eager_note") or []) or "eager changed between two runs"
        notes.append({"kind": "eager-unreproducible", "text": text})
    cause = v1_cause(combo)
    verdict = VERDICT_OF_CAUSE[cause]
    return {**combo, "verdict": verdict, "cause": cause, "notes": combo.get("notes") or notes}


def v1_cause(combo: dict[str, Any]) -> str:
    """The cause of a version-1 combination (which has none), from its structured fields."""
    verdict = combo["verdict"]
    cold, hot = combo.get("cold") or {}, combo.get("hot") or {}
    if verdict == "skipped":
        return (
            "no-device" if str(combo.get("reason")).startswith("no CUDA device") else "unsupported"
        )
    if verdict == "safe":
        return "hit"
    if verdict == "no-gain":
        if hot.get("kernels_built"):
            return "rebuilt"
        return "miss" if combo.get("misses") or not combo.get("hits") else "slow"
    if verdict == "error":
        return "cold-error" if cold.get("status") not in (None, "ok") else "not-run"
    status = hot.get("status")
    if status in ("crash", "timeout"):
        return str(status)
    if status != "ok":
        return "hot-error"
    errors = combo.get("max_abs_err") or {}
    atol = float((combo.get("tolerance") or {}).get("atol") or 0.0)
    if (errors.get("cold_vs_eager") or 0.0) > atol and errors.get("hot_vs_cold") == 0.0:
        # version 1 called a cold compile that differs from eager unsafe; hot matched cold
        return "compiler-mismatch"
    if hot.get("recompiles") and errors.get("hot_vs_cold") == 0.0:
        return "recompile"
    return "hot-mismatch"


def from_document(doc: Any, where: str) -> Results:
    """Turn a parsed document of either schema (version 1 or 2) into version-2 `Results`."""
    if not isinstance(doc, dict):
        raise UsageError(f"{where}: not a results document (a JSON object was expected)")
    schema = doc.get("schema")
    if schema in (RESULTS_SCHEMA, RESULTS_SCHEMA_V1):
        doc = check_results_doc(doc, where)
        shard = Shard(doc, where)
        return Results(
            RESULTS_SCHEMA,
            str(doc.get("report_id") or "fxcache"),
            [Group(group_key(doc), [shard])],
            doc,
        )
    if schema in (MERGED_SCHEMA, MERGED_SCHEMA_V1):
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
        merged = {
            **doc,
            "schema": MERGED_SCHEMA,
            "groups": [
                {**gdoc, "shards": [s.doc for s in group.shards]}
                for gdoc, group in zip(groups_doc, groups, strict=True)
            ],
        }
        return Results(MERGED_SCHEMA, str(doc.get("report_id") or "fxcache"), groups, merged)
    raise UsageError(
        f"{where}: schema {schema!r} is not supported (expected one of {', '.join(SCHEMAS)}); "
        "produce it with 'fxcache verify --json' or 'fxcache merge' of this fxcache version"
    )


def read_json(path: str | Path) -> Any:
    """Parse a results file; UsageError with one line when it is missing, not UTF-8 or not
    JSON."""
    p = Path(path)
    if not p.exists() and not p.is_symlink():
        raise UsageError(f"{p}: no such results file; run 'fxcache verify --json {p}'")
    return userfiles.parse_json(userfiles.read_text(p, str(p)), str(p), _integer(str(p)))


_MAX_INT_DIGITS = len(str(schema_check.INT_LIMIT))


def _integer(where: str) -> Callable[[str], int]:
    """json's hook for integer literals: no result holds an integer of more than 19 digits,
    and Python refuses to convert one of more than 4,300 with a traceback."""

    def parse(literal: str) -> int:
        if len(literal.lstrip("-")) > _MAX_INT_DIGITS:
            raise UsageError(
                f"{where}: holds an integer of {len(literal.lstrip('-'))} digits, too large for "
                "any results field; re-run 'fxcache verify --json' to produce a valid document"
            )
        return int(literal)

    return parse


def load(path: str | Path) -> Results:
    """Read and validate a results document of either schema."""
    return from_document(read_json(path), str(path))
