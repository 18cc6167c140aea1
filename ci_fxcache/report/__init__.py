"""Reports rendered from results documents: view model, markdown/text/JUnit, known issues."""

from __future__ import annotations

from ci_fxcache import resultsdoc
from ci_fxcache.report import known_issues, model


def build(path: str) -> tuple[resultsdoc.Results, model.Report]:
    """Load a results document of either schema and build its report model."""
    loaded = resultsdoc.load(path)
    return loaded, model.build(loaded, known_issues.load_builtin())


def safe_combo_ids(report: model.Report) -> list[str]:
    """Ids that are safe wherever they ran: never worse than `safe` on any runner."""
    worst: dict[str, str] = {}
    for row in report.all_rows:
        if row.verdict == "skipped":
            continue
        cid = str(row.combo["id"])
        if (
            cid not in worst
            or resultsdoc.VERDICT_ORDER[row.verdict] < resultsdoc.VERDICT_ORDER[worst[cid]]
        ):
            worst[cid] = row.verdict
    return sorted(cid for cid, v in worst.items() if v == "safe")
