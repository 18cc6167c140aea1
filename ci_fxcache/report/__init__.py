"""Reports rendered from results documents: view model, markdown/text/JUnit, known issues."""

from __future__ import annotations

from typing import Any

from ci_fxcache.report import known_issues, model
from ci_fxcache.results import reader


def build(path: str) -> tuple[reader.Results, model.Report]:
    """Load a results document of either schema and build its report model."""
    loaded = reader.load(path)
    return loaded, model.build(loaded, known_issues.load_builtin())


def from_document(doc: dict[str, Any], where: str) -> model.Report:
    """The report model of a results document already in memory (`where` names it in errors)."""
    return model.build(reader.from_document(doc, where), known_issues.load_builtin())


def safe_combo_ids(report: model.Report) -> list[str]:
    """Ids that are safe wherever they ran: never worse than `safe` on any runner."""
    worst: dict[str, str] = {}
    for row in report.all_rows:
        if row.verdict == "skipped":
            continue
        cid = str(row.combo["id"])
        if cid not in worst or reader.VERDICT_ORDER[row.verdict] < reader.VERDICT_ORDER[worst[cid]]:
            worst[cid] = row.verdict
    return sorted(cid for cid, v in worst.items() if v == "safe")


def safe_mechanisms(report: model.Report) -> frozenset[str]:
    """Mechanisms this run verified safe: at least one combination safe, none worse anywhere
    (the job line's advice names only these)."""
    seen: dict[str, bool] = {}
    for row in report.all_rows:
        if row.verdict == "skipped":
            continue
        name = str(row.combo.get("mechanism"))
        seen[name] = seen.get(name, True) and row.verdict == "safe"
    return frozenset(name for name, safe in seen.items() if safe)
